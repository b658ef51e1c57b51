"""The data stage for tests that build a `Recipe` directly (no recipe file, so no compiled Plan): it runs with
the compiler's own data decisions (`ftune.plan.batching.data_plan`), as `Plan.data` would hold them."""

from __future__ import annotations


def decided(recipe, world_size: int = 1, **changes):
    """`Plan.data` for `recipe` on `world_size` processes; `changes` override a decision (a Plan's own word)."""
    from ftune.plan.batching import data_plan

    t = recipe.train
    plan = data_plan(recipe, step_samples=t.per_device_batch_size * t.gradient_accumulation_steps * world_size)
    return plan.model_copy(update=changes) if changes else plan


def build(recipe, tokenizer, *, world_size: int = 1, **kwargs):
    """`ftune.datastage.build` with the decisions the compiler makes for `recipe`."""
    from ftune.datastage import build as stage

    return stage(recipe, tokenizer, decided(recipe, world_size), **kwargs)
