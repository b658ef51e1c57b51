"""When evaluations and checkpoints happen: `strategy`/`steps`, or `per_epoch` compiled to the Trainer's ratios.

Kept here (not in plan/trainer.py, which calls it) because the recipe rules need the very same numbers to
refuse, before launch, the schedules `TrainingArguments` would refuse after it (load_best's multiple check).

transformers reads `eval_steps`/`save_steps` below 1 as a ratio of the run's total optimizer steps and rounds
up: every `ceil(total * ratio)` steps. With `train.epochs: E`, N per epoch is the ratio 1/(E*N); it is floored
at 12 decimals so that an exact division (total = 24, ratio 1/12) is not pushed to the next step by float error.
A ratio that would reach 1 (E*N <= 1: at most one per run) becomes the `epoch` strategy.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ftune.recipe.schema import Recipe

Schedule = tuple[str, "int | float | None"]  # (strategy, steps): steps is None, an int, or a ratio < 1


def per_epoch_ratio(per_epoch: int, epochs: float) -> Schedule:
    """N per epoch over `epochs` epochs as the Trainer's (strategy, steps)."""
    times = epochs * per_epoch
    if times <= 1:
        return "epoch", None
    return "steps", math.floor(1e12 / times) / 1e12


def eval_schedule(recipe: Recipe) -> Schedule:
    """(eval_strategy, eval_steps) as the Trainer gets them; ('no', None) without eval data."""
    e = recipe.eval
    if recipe.data.eval is None:
        return "no", None
    if e.per_epoch is not None and recipe.train.epochs is not None:
        return per_epoch_ratio(e.per_epoch, recipe.train.epochs)
    return e.strategy, e.steps


def save_schedule(recipe: Recipe) -> Schedule:
    """(save_strategy, save_steps) as the Trainer gets them."""
    c = recipe.checkpoint
    if c.per_epoch is not None and recipe.train.epochs is not None:
        strategy, steps = per_epoch_ratio(c.per_epoch, recipe.train.epochs)
        return strategy, c.steps if steps is None else steps
    return c.strategy, c.steps


def evaluates(recipe: Recipe) -> bool:
    """Whether the recipe asks for evaluations during training (by strategy or per_epoch)."""
    return recipe.eval.strategy != "no" or recipe.eval.per_epoch is not None
