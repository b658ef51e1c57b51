"""One perplexity: exp of the eval data's mean token NLL, for a causal LM's SFT only, computed in one function that the
Trainer's logs, the progress line, the summary and `ftune eval` all read."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from ftune.plan.evaluation import has_perplexity, perplexity, with_perplexity
from ftune.recipe.schema import Recipe

FTUNE = Path(__file__).resolve().parents[2] / "ftune"


def _recipe(**sections) -> Recipe:
    base = {"name": "p", "model": {"path": "m"}, "data": {"train": [{"path": "d.jsonl"}]}}
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    return Recipe.model_validate(base)


@pytest.mark.parametrize(("sections", "expected"), [
    ({}, True),
    ({"model": {"task": "sequence-classification", "num_labels": 2}}, False),  # a loss over labels, not tokens
    ({"train": {"objective": "dpo"}, "data": {"train": [{"path": "d.jsonl", "format": "preference"}]}}, False),
])
def test_which_runs_have_a_perplexity(sections, expected):
    recipe = _recipe(**sections)
    assert has_perplexity(recipe) is expected
    metrics = with_perplexity({"eval_loss": 2.0, "epoch": 1.0}, recipe)
    assert ("eval_perplexity" in metrics) is expected
    if expected:
        assert metrics["eval_perplexity"] == pytest.approx(math.exp(2.0), rel=1e-12)
    assert with_perplexity({"loss": 2.0}, recipe) == {"loss": 2.0}  # no eval loss, nothing added


def test_a_diverged_loss_gives_a_finite_perplexity():
    assert perplexity(0.0) == 1.0
    assert perplexity(1e6) == math.exp(50.0)


def test_no_other_module_computes_a_perplexity():
    """The formula is written once: no other exponential of a loss anywhere in ftune."""
    found = [f"{p.relative_to(FTUNE)}:{i}" for p in sorted(FTUNE.rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"\b(math|torch|np|numpy)\.exp\(|\.exp\(\)", line)]
    assert found == ["plan/evaluation.py:27"], found
