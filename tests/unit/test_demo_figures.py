"""Every demo figure README.md and docs/demo.md quote comes from one measured, dated summary (docs/demo-summary.json,
what `make demo` wrote), rendered by `ftune.demo.figures`: a hand-edited or stale figure fails here."""

from __future__ import annotations

import json

import pytest
import yaml

from ftune.demo import figures, sums


@pytest.mark.parametrize("page", figures.PAGES, ids=lambda p: p.name)
def test_the_page_quotes_the_summary(page):
    summary = json.loads(figures.SUMMARY.read_text())
    quoted = figures.block(page.read_text())
    assert quoted is not None, f"{page} lost its demo-figures block"
    assert quoted == figures.markdown(summary), "regenerate: python -m ftune.demo.figures runs/demo-summary.json"


def test_the_summary_is_a_full_learned_run():
    summary = json.loads(figures.SUMMARY.read_text())
    assert summary["learned"] is True and summary["quick"] is False and summary["date"]
    assert "kernels)" in summary["machine"]  # the CPU and its kernels: other kernels print other digits
    real = summary["real"]  # the ranges the pages quote as holding on every machine (figures.EVERY_MACHINE)
    assert real["rule_after"] >= 0.9 and real["rule_before"] == 0.0
    assert real["knowledge_after"] >= real["knowledge_before"] == 1.0
    assert len(real["samples"]) == real["held_out_prompts"] == 10
    rl = summary["rl_real"]  # stage D (GRPO on stage C's adapter) ran its steps and raised the held-out score
    recipe = yaml.safe_load((figures.REPO / "recipes/demo/smollm2-sums-grpo.yaml").read_text())
    assert rl["steps"] == recipe["train"]["max_steps"] == rl["reward"][-1][0]
    assert rl["score_after"] >= rl["score_before"] + 0.15
    assert len(rl["samples"]) == rl["held_out_questions"] == 24
    assert [s["before"] for s in rl["samples"]] != [s["after"] for s in rl["samples"]]
    held = sums.pairs()[1]  # the scores are the numeric reward over the quoted answers, recomputed here
    assert [s["prompt"] for s in rl["samples"]] == [sums.TEMPLATE.format(a=a, b=b) for a, b in held]
    assert rl["score_before"] == sums.score([s["before"] for s in rl["samples"]], held)
    assert rl["score_after"] == sums.score([s["after"] for s in rl["samples"]], held)


def test_a_changed_figure_is_caught():
    summary = json.loads(figures.SUMMARY.read_text())
    text = figures.markdown(summary)
    summary["real"]["rule_after"] = 0.5
    assert figures.markdown(summary) != text and "50%" in figures.markdown(summary)
