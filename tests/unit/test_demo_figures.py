"""Every demo figure README.md and docs/demo.md quote comes from one measured, dated summary (docs/demo-summary.json,
what `make demo` wrote), rendered by `ftune.demo.figures`: a hand-edited or stale figure fails here."""

from __future__ import annotations

import json

import pytest

from ftune.demo import figures


@pytest.mark.parametrize("page", figures.PAGES, ids=lambda p: p.name)
def test_the_page_quotes_the_summary(page):
    summary = json.loads(figures.SUMMARY.read_text())
    quoted = figures.block(page.read_text())
    assert quoted is not None, f"{page} lost its demo-figures block"
    assert quoted == figures.markdown(summary), "regenerate: python -m ftune.demo.figures runs/demo-summary.json"


def test_the_summary_is_a_full_learned_run():
    summary = json.loads(figures.SUMMARY.read_text())
    assert summary["learned"] is True and summary["quick"] is False and summary["date"]
    rl = summary["rl"]  # stage B2 (GRPO) ran its 30 steps from where stage B ended
    assert rl["reward"][-1][0] == 30 and rl["accuracy_before"] == summary["lora"]["accuracy_after"]
    b = summary["lora"]  # the ranges the pages quote as holding on every machine (figures.EVERY_MACHINE)
    assert b["eval_loss_after"] <= 0.7 * b["eval_loss_before"]
    assert b["accuracy_before"] <= 0.1 and b["accuracy_after"] >= b["accuracy_before"] + 0.3
    assert rl["reward_last"] >= rl["reward_first"] - 0.15
    assert "kernels)" in summary["machine"]  # the CPU and its kernels: other kernels print other digits
    real = summary["real"]
    assert real["rule_after"] >= 0.9 and real["rule_before"] == 0.0
    assert real["knowledge_after"] >= real["knowledge_before"] == 1.0
    assert len(real["samples"]) == real["held_out_prompts"] == 10


def test_a_changed_figure_is_caught():
    summary = json.loads(figures.SUMMARY.read_text())
    text = figures.markdown(summary)
    summary["real"]["rule_after"] = 0.5
    assert figures.markdown(summary) != text and "50%" in figures.markdown(summary)
