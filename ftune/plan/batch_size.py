"""The micro-batch, the accumulation and checkpointing as the plan decides them (`train.global_batch_size`,
`per_device_batch_size: auto`, `gradient_checkpointing: auto`).

`global_batch_size` fixes the rows per optimizer step; the accumulation follows from the micro-batch and the
data-parallel ranks. `auto` is sized from the plan's memory estimate, which lives a layer above the compiler
(`ftune.estimate.autobatch`): the command hands the compiler a `Chooser`. A command that plans no memory (`ftune
data`, `eval`) hands none, and the plan takes the smallest micro-batch with checkpointing: the same optimizer
batch, the least memory. Light module: no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ftune.errors import Problem
from ftune.recipe.schema import Recipe


@dataclass(frozen=True)
class Choice:
    """What a chooser decided: the micro-batch, checkpointing, and the sentence that says why."""

    per_device: int
    checkpointing: bool
    why: str


Chooser = Callable[..., "Choice | Problem"]
"""`choose(recipe, candidates=[rows...], checkpointing=(False, True), key=...) -> Choice | Problem`: `recipe` with one
row per device and the rest as it runs; the fastest candidate that fits, or a Problem located at `key` (the auto
key the recipe wrote: `per_device_batch_size`, else `gradient_checkpointing`)."""


def auto(recipe: Recipe) -> bool:
    t = recipe.train
    return t.per_device_batch_size == "auto" or t.gradient_checkpointing == "auto"


def split_problems(recipe: Recipe, data_parallel: int) -> list[Problem]:
    """`global_batch_size` against the job: whole rows per data-parallel rank, and a micro-batch that divides
    them (kto: 2 rows or more). A row of the table of checks (`ftune.plan.checks`), so `launch-script` says it too."""
    t = recipe.train
    if t.global_batch_size is None:
        return []
    per_rank, rest = divmod(t.global_batch_size, data_parallel)
    if rest or not per_rank:
        near = max(per_rank, 1) * data_parallel
        return [Problem.at("train.global_batch_size", f"{t.global_batch_size} rows per step don't split evenly over "
                           f"the job's {data_parallel} data-parallel ranks", f"use a multiple of {data_parallel}, "
                           f"e.g. {near}")]
    if t.per_device_batch_size == "auto":
        if t.objective == "kto" and per_rank < 2:
            return [Problem.at("train.global_batch_size", f"kto needs 2 or more rows per device; "
                               f"{t.global_batch_size} rows over {data_parallel} rank(s) give {per_rank}",
                               f"use global_batch_size {2 * data_parallel} or more")]
    elif per_rank % t.per_device_batch_size:
        divisors = ", ".join(str(m) for m in range(1, per_rank + 1) if per_rank % m == 0)
        near = t.per_device_batch_size * data_parallel * max(per_rank // t.per_device_batch_size, 1)
        return [Problem.at("train.global_batch_size", f"each of the {data_parallel} data-parallel rank(s) takes "
                           f"{per_rank} rows per step, which per_device_batch_size {t.per_device_batch_size} doesn't "
                           f"divide", f"per_device_batch_size {divisors} or `auto`; or global_batch_size {near}")]
    return []


def resolve(recipe: Recipe, data_parallel: int, choose: Chooser | None
            ) -> tuple[Recipe, list[Problem], str | None]:
    """The recipe with the batch keys as numbers (auto decided, the accumulation derived from global_batch_size),
    the problems, and the plan's note; unchanged without global_batch_size or auto."""
    t = recipe.train
    if t.global_batch_size is None and not auto(recipe):
        return recipe, [], None
    if found := split_problems(recipe, data_parallel):
        return recipe, found, None
    per_rank = t.global_batch_size // data_parallel if t.global_batch_size is not None else None
    problems: list[Problem] = []
    if t.per_device_batch_size == "auto":
        least = 2 if t.objective == "kto" else 1  # kto's KL term pairs rows within a batch
        candidates = [m for m in range(least, per_rank + 1) if per_rank % m == 0]
    else:
        candidates = [t.per_device_batch_size]
    checkpointing = (False, True) if t.gradient_checkpointing == "auto" else (t.gradient_checkpointing,)
    note = None
    if auto(recipe):
        if choose is None:  # nothing sized here: the least memory, the same optimizer batch
            choice = Choice(candidates[0], checkpointing[-1], "not sized by this command (it plans no memory): the "
                            "smallest micro-batch" + (", checkpointing on" if len(checkpointing) > 1 else ""))
        else:
            one = recipe.model_copy(update={"train": t.model_copy(update={
                "per_device_batch_size": 1, "gradient_accumulation_steps": 1, "global_batch_size": None,
                "gradient_checkpointing": checkpointing[0]})})
            key = "per_device_batch_size" if t.per_device_batch_size == "auto" else "gradient_checkpointing"
            choice = choose(one, candidates=candidates, checkpointing=checkpointing, key=key)
            if isinstance(choice, Problem):
                return recipe, [choice], None
        per_device, ckpt = choice.per_device, choice.checkpointing
        note = choice.why
    else:
        per_device, ckpt = t.per_device_batch_size, t.gradient_checkpointing
    accumulation = per_rank // per_device if per_rank is not None else t.gradient_accumulation_steps
    if accumulation > 1 and t.optimizer.endswith("_layerwise"):
        problems.append(Problem.at("train.global_batch_size", f"layer-wise '{t.optimizer}' can't accumulate "
                                   f"gradients; {t.global_batch_size} rows per step need {accumulation} "
                                   f"micro-batches of {per_device}",
                                   f"use global_batch_size {per_device * data_parallel}"))
    said = (f"batch: {per_device} row(s) per device x {accumulation} accumulation x {data_parallel} rank(s)"
            + (f" = global_batch_size {t.global_batch_size}" if t.global_batch_size is not None else "")
            + (f"; gradient_checkpointing {'on' if ckpt else 'off'}" if t.gradient_checkpointing == "auto" else "")
            + (f" ({note})" if note else ""))
    decided = t.model_copy(update={"per_device_batch_size": per_device, "gradient_accumulation_steps": accumulation,
                                   "gradient_checkpointing": ckpt})
    return recipe.model_copy(update={"train": decided}), problems, said
