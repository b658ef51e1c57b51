"""Long rows in `ftune plan`: the tiled MLP's effect on the activation profile (`train.tiled_mlp`), and the longest
row each long-context lever the recipe leaves off would allow (ALST's levers, as far as ftune has them: Liger's fused
loss, checkpointing, offloaded checkpoints, the tiled MLP), so the plan says which lever raises the limit."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ftune.estimate.facts import ActivationProfile, ParamFact
from ftune.estimate.memory import TILE_SLICE, Layout, fmt_bytes, per_device
from ftune.estimate.parallel import longest_sequence, split_layout
from ftune.estimate.probe import HIDDEN_KEYS, _config_int
from ftune.plan.tiling import loss_problems, shards, slices

if TYPE_CHECKING:
    from ftune.recipe.schema import Recipe


def hidden_size(config, model) -> int:
    """The decoder's width: what an MLP call's input ends in (the `auto` slices' divisor), read as the formula
    profile reads it."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return _config_int(text, HIDDEN_KEYS) or model.get_input_embeddings().weight.shape[-1]


def tiled(recipe: Recipe, profile: ActivationProfile, seq: int, hidden: int, rule=None
          ) -> tuple[ActivationProfile, str | None]:
    """`profile` with the MLPs tiled by `rule` (default the recipe's; None: not tiled), and the memory item that
    stays the same size as rows grow (`longest_row`'s `constant`): an `auto` slice holds hidden-size tokens at most."""
    rule = shards(recipe) if rule is None else rule
    if rule is None:
        return profile, None
    return profile.tiled(slices(rule, seq, hidden)), TILE_SLICE if rule == "auto" and seq >= hidden else None


def longer_rows(recipe: Recipe, facts: list[ParamFact], profile: ActivationProfile, layout: Layout, seq: int,
                hidden: int, device_memory: int, longest: int, finish, measure) -> str | None:
    """The longest row with each lever the recipe leaves off added in turn (`profile` untiled, `layout` the
    recipe's; `finish` applies what the estimate adds after `per_device`: parallel splits, a teacher; `measure(
    profile, checkpointing, rule)` the gradients in flight of a meta step with the MLP tiled), with the host memory
    offloaded rows take; None when every lever is on or none raises the limit."""
    steps: list[tuple[str, Layout, object]] = []
    if layout.device == "cuda" and not (layout.fused_loss or layout.loss_slices) and recipe.model.task == "causal-lm":
        layout = replace(layout, fused_loss=True)
        steps.append(("train.kernels: liger", layout, None))
    if not layout.checkpointing:
        layout = replace(layout, checkpointing=True)
        steps.append(("train.gradient_checkpointing", layout, None))
    if not layout.offload_activations:
        layout = replace(layout, offload_activations=True)
        steps.append(("train.activation_offloading", layout, None))
    if shards(recipe) is None:
        steps.append(("train.tiled_mlp", layout, "auto"))
    said, best = [], longest
    for name, lay, tile in steps:
        prof, constant = tiled(recipe, profile, seq, hidden, tile)
        if tile is not None:  # tiling changes what backward holds in flight too
            prof = replace(prof, inflight_bytes=measure(prof, lay.checkpointing, tile))
        memory = finish(per_device(facts, prof, lay))
        rows = longest_sequence(memory, seq, device_memory, 1, constant)
        if rows <= best:
            continue
        best = rows
        host = f", {fmt_bytes(host_at(memory, rows, seq))} of host memory" if memory.offloaded else ""
        said.append(f"+ {name}: {rows:,}{host}")
    if not said:
        return None
    return "longer rows (memory alone; levers added in turn): " + "; ".join(said)


def could_tile_loss(recipe: Recipe, model) -> bool:
    """Whether the recipe, which doesn't set `train.tiled_loss`, could: its objective, task, kernels, strategy and
    model family allow it (the recipe rules' and the plan's checks on a copy that sets it)."""
    from ftune.recipe.rules.train import tiled_loss_fits

    if recipe.train.tiled_loss:
        return False
    trial = recipe.model_copy(update={"train": recipe.train.model_copy(update={"tiled_loss": True})})
    return not any(True for _ in tiled_loss_fits(trial)) and not loss_problems(trial, model)


def host_at(memory, rows: int, seq: int) -> int:
    """Host memory at a row of `rows` tokens, from `memory` planned at `seq`: the offloaded activations grow with the
    row, offloaded states (FSDP's parameters, gradients and optimizer; DeepSpeed's) stay the same."""
    states = memory.offloaded - memory.offloaded_activations
    return states + memory.offloaded_activations * rows // seq


def finisher(recipe: Recipe, teacher):
    """What `estimate` does to `per_device`'s result: the parallel split, then the teacher."""
    from ftune.estimate.teacher import with_teacher

    return lambda memory: with_teacher(split_layout(memory, recipe.distributed.parallelism), teacher)


def host_note(offloaded: int, processes: int, host: int | None) -> str | None:
    """What offloading (activations, FSDP's or DeepSpeed's states) puts in the machine's RAM (`host` bytes), said
    when the processes on it would need more than it has."""
    if host is None or offloaded * processes <= host:
        return None
    each = f"{fmt_bytes(offloaded)} per process x {processes}" if processes > 1 else fmt_bytes(offloaded)
    return (f"offloaded to host memory: {each}, more than the machine's {fmt_bytes(host)} of RAM: the run would "
            "run out of host memory (shorten data.max_seq_length, or offload less)")


def host_rows(memory, seq: int, host: int, processes: int) -> int | None:
    """The longest row whose offloaded bytes, for every process on the machine, fit its `host` bytes of RAM (None:
    nothing offloaded grows with the row); `memory` planned at `seq` tokens."""
    if not memory.offloaded_activations:
        return None
    room = host // max(processes, 1) - (memory.offloaded - memory.offloaded_activations)
    return max(room, 0) * seq // memory.offloaded_activations


def host_cap(memory, seq: int, longest: int, host: int | None, processes: int, notes: list[str]) -> int:
    """`longest` (the device's) capped by the machine's RAM when offloaded activations would outgrow it, with a
    note naming both."""
    rows = None if host is None else host_rows(memory, seq, host, processes)
    if rows is None or rows >= longest:
        return longest
    notes.append(f"longest row: the device holds {longest:,} tokens, but their offloaded activations would outgrow "
                 f"the machine's {fmt_bytes(host)} of RAM" + (f" ({processes} processes)" if processes > 1 else "")
                 + f": {rows:,} tokens fit both")
    return rows
