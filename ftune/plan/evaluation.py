"""What a run's evaluation reports, decided in one place: perplexity (which runs have one, and its one formula),
and which generation metrics score a run's greedy answers (eval.generate).

Exact match fits short, closed answers (a label, a number, an extraction); free-form chat answers almost never
match a reference to the character, so exact match would report 0 for a model that learned its task. Unless the
recipe names `eval.generate.metrics`: exact match and F1 for instruction data, F1 (word overlap) alone for chat.
"""

from __future__ import annotations

import math

from ftune.recipe.objectives import family_of
from ftune.recipe.schema import Recipe

PERPLEXITY_CAP = 50.0
"""exp(50) ~ 5e21: a diverged loss still gives a finite, printable perplexity (a non-finite loss stops the run)."""


def has_perplexity(recipe: Recipe) -> bool:
    """Perplexity is exp of the mean token NLL: a causal LM's SFT loss is one; a preference or RL objective's loss
    and a classifier's loss over its labels are not."""
    return family_of(recipe).next_token_loss and recipe.model.task == "causal-lm"


def perplexity(mean_token_nll: float) -> float:
    return math.exp(min(mean_token_nll, PERPLEXITY_CAP))


def with_perplexity(metrics: dict, recipe: Recipe) -> dict:
    """`metrics` with `eval_perplexity` added from its `eval_loss` where the run has one (in place; returned).
    The Trainer's logs (metrics.jsonl, the progress line, the summary) and `ftune eval` all go through here."""
    if "eval_loss" in metrics and has_perplexity(recipe):
        metrics["eval_perplexity"] = perplexity(metrics["eval_loss"])
    return metrics


def generation_metrics(recipe: Recipe) -> list[str]:
    section = recipe.eval.generate
    if section is not None and section.metrics is not None:
        return list(section.metrics)
    from ftune.datafiles.prompts import decide

    return ["f1"] if decide(recipe).chat else ["exact_match", "f1"]  # the prompts the answers follow
