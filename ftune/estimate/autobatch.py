"""`per_device_batch_size: auto` and `gradient_checkpointing: auto`: the fastest micro-batch that fits, from the
plan's memory estimate (`ftune.plan.batch_size` asks; `plan` and `run` hand the compiler `chooser(...)`).

One estimate at one row per device for each checkpointing setting: a step's activations and backward temporaries
grow linearly with the rows of a micro-batch (at a fixed row length, attention's scores too), the weights,
gradients and optimizer do not, so the rows that fit follow from it (`longest_sequence` counting rows instead of
tokens). A tiled MLP's `auto` slice is counted as growing with the rows too: the count errs on the safe side.

Of the micro-batches that fit in `HEADROOM` of the device's memory, the plan takes the fastest by a simple model
of a step: a micro-batch runs at full speed from `FULL_SPEED_TOKENS` tokens (fewer leave the device's matmuls
short of work), and checkpointing recomputes the forward: a step costs `RECOMPUTE` more with it (1.5x with a frozen
base, whose backward computes no weight gradients: forward 1 + backward ~1 + recompute 1; 4/3 when every weight
trains). Ties go to no checkpointing, then the smaller micro-batch (past full speed, more rows only take memory).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ftune.errors import Problem, RecipeError
from ftune.estimate.memory import DeviceMemory, fmt_bytes
from ftune.estimate.parallel import longest_sequence
from ftune.plan.batch_size import Choice

if TYPE_CHECKING:
    from ftune.recipe.schema import Recipe

HEADROOM = {"cuda": 0.9, "cpu": 0.5}
"""Of the device's memory, what the plan fills: on a GPU the estimate is within a few percent of the allocator's
peak and the caching allocator fragments; on a CPU the host also holds the data, the tokenizer and Python."""
FULL_SPEED_TOKENS = {"cuda": 8192, "cpu": 1024}
RECOMPUTE = {"frozen base": 1.5, "full": 4 / 3}


def chooser(gpu_memory: int | None = None, seq_length: int | None = None):
    """The `Chooser` a command hands the compiler: estimates on the compiler's world and device, against
    `gpu_memory` (`plan --gpu-memory`), else the device this machine has (its RAM on a CPU)."""

    def choose(recipe: Recipe, *, candidates: list[int], checkpointing: tuple[bool, ...], key: str,
               world_size: int, num_processes: int, device: str) -> Choice | Problem:
        return choose_batch(recipe, candidates, checkpointing, world_size=world_size, num_processes=num_processes,
                            device=device, gpu_memory=gpu_memory, seq_length=seq_length, key=key)

    return choose


def rows_that_fit(memory: DeviceMemory, budget: int) -> int:
    """Rows per micro-batch whose peak fits `budget`, from `memory` planned at one row."""
    return longest_sequence(memory, 1, budget)


def choose_batch(recipe: Recipe, candidates: list[int], checkpointing: tuple[bool, ...], *, world_size: int,
                 num_processes: int, device: str, gpu_memory: int | None, seq_length: int | None,
                 key: str = "per_device_batch_size") -> Choice | Problem:
    """The fastest of `candidates` x `checkpointing` that fits (`recipe` at one row per device), or a Problem at
    `train.<key>`."""
    from ftune.estimate.estimate import estimate

    seq = seq_length or recipe.data.max_seq_length
    share = HEADROOM.get(device, 0.9)
    fits: dict[bool, int] = {}
    budget = total = None
    for ckpt in checkpointing:
        r = recipe.model_copy(update={"train": recipe.train.model_copy(update={"gradient_checkpointing": ckpt})})
        try:
            est = estimate(r, world_size=world_size, num_processes=num_processes, gpu_memory=gpu_memory,
                           device=device, seq_length=seq)
        except RecipeError as err:
            return err.problems[0]
        if est.device_memory is None:
            return Problem.at(f"train.{key}", f"{key} auto sizes the micro-batch from the device's memory, which "
                              "this plan doesn't know (it plans for GPUs this machine doesn't have)",
                              "pass --gpu-memory SIZE (e.g. 80GiB), or set a value")
        total = est.device_memory
        budget = int(total * share)
        memory = DeviceMemory(tuple(est.memory), est.peak_phase, est.total_bytes, est.offloaded_bytes)
        fits[ckpt] = rows_that_fit(memory, budget)
        one_row = est.total_bytes
        levers = next((n for n in est.notes if n.startswith("longer rows")), None)  # what the last one leaves off
    options = [(m, c) for c in checkpointing for m in candidates if m <= fits[c]]
    if not options:
        return Problem.at(f"train.{key}", f"no micro-batch fits: {candidates[0]} row(s) of {seq:,} tokens"
                          + (" with checkpointing" if checkpointing[-1] else "") + f" need more than "
                          f"{fmt_bytes(budget)} ({share:.0%} of {fmt_bytes(total)}); one row "
                          f"plans {fmt_bytes(one_row)}",
                          "run `ftune plan` for its suggestions (QLoRA, an 8-bit optimizer, offloading, sharding), "
                          "shorten data.max_seq_length, or set the values by hand (auto keeps "
                          f"{1 - share:.0%} free; `ftune plan` says whether they fit)"
                          + (f"; the one-row plan's {levers}" if levers else ""))
    speed_at = FULL_SPEED_TOKENS.get(device, 8192)
    recompute = RECOMPUTE["full" if recipe.peft.trains_whole_model else "frozen base"]

    def speed(option: tuple[int, bool]) -> tuple[float, bool, int]:
        m, ckpt = option
        return min(1.0, m * seq / speed_at) / (recompute if ckpt else 1.0), not ckpt, -m

    m, ckpt = max(options, key=speed)
    most = ", ".join(f"{fits[c]:,} {'with' if c else 'without'} checkpointing" for c in checkpointing)
    why = (f"rows that fit in {fmt_bytes(budget)}, {share:.0%} of {fmt_bytes(total)}: {most}; "
           f"the fastest by the plan's step model: full speed from {speed_at:,} tokens a micro-batch, checkpointing "
           f"x{recompute:.2f} a step")
    return Choice(m, ckpt, why)
