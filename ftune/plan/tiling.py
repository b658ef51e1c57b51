"""ALST's tiling levers: the tiled MLP (`train.tiled_mlp`, carried out by `ftune.tiled_mlp`) and the tiled loss
(`train.tiled_loss`, `ftune.tiled_loss`): which modules are tiled, into how many slices, and the models each can't be
right on. Light: no torch at import (the meta model is handed in)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from ftune import tiled_loss
from ftune.errors import Problem
from ftune.tiled_mlp import slices

if TYPE_CHECKING:
    from ftune.recipe.schema import Recipe

Shards = int | Literal["auto"]
"""A fixed slice count, or `auto`: each call's tokens / hidden size, rounded up (ALST's rule)."""


def shards(recipe: Recipe) -> Shards | None:
    """What the Plan carries: None when the MLP is not tiled."""
    t = recipe.train
    return None if not t.tiled_mlp else t.tiled_mlp_shards or "auto"


def decoder_list(model):
    """The text model's ModuleList of decoder layers: the one list of `num_hidden_layers` modules that each have an
    `mlp` (a vision tower's list, when as long, is left out); None when there is no such list."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    depth = getattr(config, "num_hidden_layers", None)
    lists = [(name, m) for name, m in model.named_modules() if type(m).__name__ == "ModuleList" and len(m) == depth
             and all(getattr(layer, "mlp", None) is not None for layer in m)]
    if len(lists) > 1:
        lists = [(name, m) for name, m in lists if "vision" not in name and "visual" not in name]
    return lists[0][1] if len(lists) == 1 else None


def decoder_layers(model) -> list:
    """The decoder layers of `decoder_list`; [] without one."""
    found = decoder_list(model)
    return list(found) if found is not None else []


def mlps(model) -> list:
    """The MLP (`layer.mlp`) of each decoder layer (`decoder_layers`)."""
    return [layer.mlp for layer in decoder_layers(model)]


def model_problems(recipe: Recipe, model) -> list[Problem]:
    """A mixture-of-experts block (its router's load-balancing loss is computed per call: slices would change it)
    or a model without one `mlp` module per decoder layer: refused at train.tiled_mlp."""
    found = loss_problems(recipe, model)
    if not recipe.train.tiled_mlp:
        return found
    from ftune.models.moe import moe_layout

    kind = type(model).__name__
    if moe_layout(model) is not None:
        found.append(Problem.at("train.tiled_mlp", f"{kind} is a mixture-of-experts model: its router balances the "
                                "experts' load over each call's tokens, so slicing the call would change the loss",
                                "set `train.tiled_mlp: false` (tiling is for dense MLPs)"))
    elif not mlps(model):
        found.append(Problem.at("train.tiled_mlp", f"found no `mlp` module in each decoder layer of {kind}, which the "
                                "tiled MLP slices", "set `train.tiled_mlp: false` (it supports decoders such as "
                                "Llama, Qwen, Mistral, Gemma)"))
    return found


def note(recipe: Recipe, config, seq: int | None) -> str | None:
    """What the plan says it tiles, at the plan's row length."""
    rule = shards(recipe)
    if rule is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = getattr(text, "hidden_size", None)
    how = f"{rule} slices" if rule != "auto" else "tokens / hidden size slices"
    if not seq or not hidden:
        return f"train.tiled_mlp: each decoder layer's MLP in {how} (forward without autograd, backward one slice " \
               "at a time)"
    n = slices(rule, seq, hidden)
    return (f"train.tiled_mlp: each decoder layer's MLP in {n} slice{'s' if n > 1 else ''} of <= {math.ceil(seq / n):,} "
            f"tokens at {seq:,} tokens a row ({how}; forward without autograd, backward one slice at a time)")


def loss_shards(recipe: Recipe) -> Shards | None:
    """What the Plan carries for `train.tiled_loss`: None when the loss is not tiled."""
    t = recipe.train
    return None if not t.tiled_loss else t.tiled_loss_shards or "auto"


def loss_problems(recipe: Recipe, model) -> list[Problem]:
    """A model whose causal-LM forward the tiled loss is not verified to reproduce (`ftune.tiled_loss.VERIFIED`:
    another family may add a router's loss, extra heads or its own logit transform): refused at train.tiled_loss."""
    if not recipe.train.tiled_loss:
        return []
    kind = getattr(model.config, "model_type", None)
    if kind in tiled_loss.VERIFIED and tiled_loss.head(model) is not None:
        return []
    return [Problem.at("train.tiled_loss", f"the tiled loss replaces the model's own forward after its decoder, and "
                       f"is verified to give the same loss and gradients on {', '.join(tiled_loss.VERIFIED)}; this "
                       f"model is {kind or type(model).__name__}",
                       "set `train.tiled_loss: false` (on CUDA, `train.kernels: liger` chunks the loss for the "
                       "families Liger patches)")]


def loss_note(recipe: Recipe, config, seq: int | None) -> str | None:
    """What the plan says it tiles of the loss, at the plan's row length."""
    rule = loss_shards(recipe)
    if rule is None:
        return None
    text = tiled_loss.text_config(config)
    hidden, vocab = getattr(text, "hidden_size", None), getattr(text, "vocab_size", None)
    how = f"{rule} slices" if rule != "auto" else "vocabulary / hidden size slices"
    if not seq or not hidden or not vocab:
        return f"train.tiled_loss: the output head and loss in {how} of each row (logits recomputed per slice)"
    n = tiled_loss.shard_count(rule, seq, hidden, vocab)
    return (f"train.tiled_loss: the output head and loss in {n} slice{'s' if n > 1 else ''} of <= "
            f"{math.ceil(seq / n):,} tokens at {seq:,} tokens a row ({how}; each slice's logits recomputed in its "
            "backward)")
