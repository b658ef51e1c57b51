"""DDP's unused-parameter search, decided before launch from the model's structure (on the meta device).

DDP all-reduces each parameter's gradient once the backward pass has produced it; a trainable parameter the
forward pass did not use never gets one, and the step hangs or fails unless DDP searches the autograd graph for
such parameters every step (`find_unused_parameters`, an extra traversal each iteration). `static_graph` is no
answer for an MoE: which experts a batch uses depends on the data.

- transformers 5 fuses an MoE layer's experts into [experts, ...] tensors (ftune.models.moe): every step indexes the
  whole tensor, so an expert no token is routed to still gets a gradient (zero in its slice; tested in
  tests/unit/test_moe_ddp.py) and there is nothing to search for: off.
- Experts kept as separate modules (a ModuleList, e.g. remote code): an idle expert gets no gradient: on.
- Any other model: transformers' own default (on for adapters and without gradient checkpointing).
"""

from __future__ import annotations

from typing import Literal

from ftune.recipe.schema import Recipe

ExpertsKind = Literal["fused", "modules"]


def experts_kind(model) -> ExpertsKind | None:
    """How an MoE model holds its experts (`fused` tensors or separate `modules`); None for a dense model."""
    from ftune.models.moe import moe_layout

    if moe_layout(model) is not None:
        return "fused"
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == "experts" and type(module).__name__ in ("ModuleList", "ModuleDict"):
            return "modules"
    return None


def find_unused(recipe: Recipe, world_size: int, experts: ExpertsKind | None, notes: list[str]) -> dict:
    """`ddp_find_unused_parameters` for TrainingArguments (empty: transformers' default), with a note saying why."""
    if recipe.distributed.strategy != "ddp" or world_size < 2 or experts is None:
        return {}
    if experts == "modules":
        notes.append("ddp: find_unused_parameters on: this model's experts are separate modules, so an expert no "
                     "token of a batch is routed to gets no gradient, and DDP must look for it every step")
        return {"ddp_find_unused_parameters": True}
    notes.append("ddp: find_unused_parameters off: the fused expert tensors take part in every step (an expert no "
                 "token is routed to gets a zero gradient), so there is no unused parameter to look for")
    return {"ddp_find_unused_parameters": False}
