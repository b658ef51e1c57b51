"""Checks that need the model's structure (not its weights), run on the meta device by the compiler.

LoRA targets that match nothing, FSDP wrap classes missing from the model, `data.max_seq_length` past the
model's positions and 4-bit shapes the CPU kernels can't run are `Problem`s at their recipe keys, reported
with every other pre-launch problem by `compile_plan` (so `plan`, `run --dry-run` and `run` refuse alike,
before the run dir is written).
"""

from __future__ import annotations

import re
from pathlib import Path

from ftune.errors import FtuneError, Problem
from ftune.modeling import build_meta_model, linear_layer_names
from ftune.plan import quantization
from ftune.recipe.schema import FsdpSection, Recipe


def config_is_local(recipe: Recipe) -> bool:
    """The model's config can be read without a hub: `model.path` is a folder holding config.json."""
    return (Path(recipe.model.path).expanduser() / "config.json").is_file()


def problems(recipe: Recipe, device: str, model=None) -> list[Problem]:
    """Every model-structure problem of `recipe` (as it runs: a continued adapter's base), on `model` (the meta
    model, built here from the config when not given)."""
    if model is None:
        try:
            model = build_meta_model(recipe)
        except FtuneError as err:  # an unreadable config: at the key that names the model
            return [Problem.at("model.path", err.message, err.hint)]
    found = target_problems(model, recipe) + wrap_class_problems(recipe, model) + position_problems(recipe, model)
    return found + quantization.check_model_config(recipe, model, device)


def target_problems(model, recipe: Recipe) -> list[Problem]:
    """LoRA target_modules that match no module of the model."""
    cfg = recipe.peft
    if cfg.method != "lora" or cfg.target_modules == "all-linear":
        return []
    names = [n for n, _ in model.named_modules()]
    for target in cfg.target_modules:
        if any(n == target or n.endswith("." + target) or re.fullmatch(target, n) for n in names):
            return []
    return [Problem.at("peft.target_modules", f"{list(cfg.target_modules)} match no module of the model",
                       target_hint(model))]


def position_problems(recipe: Recipe, model) -> list[Problem]:
    """data.max_seq_length past the model's max_position_embeddings: positions beyond it have no embedding
    (an index error mid-run) or were never trained (silently wrong), so training can't be right."""
    limit = recipe.data.max_seq_length
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    positions = getattr(text, "max_position_embeddings", None)
    if not limit or not isinstance(positions, int) or positions <= 0 or limit <= positions:
        return []
    return [Problem.at("data.max_seq_length",
                       f"{limit} is longer than the model's max_position_embeddings ({positions}, in "
                       f"{recipe.model.path}/config.json)",
                       f"set data.max_seq_length to at most {positions}")]


def target_hint(model) -> str:
    return (f"linear layers in this model: {', '.join(linear_layer_names(model))} "
            "(or use `peft.target_modules=all-linear`)")


def wrap_class_problems(recipe: Recipe, model) -> list[Problem]:
    """FSDP transformer wrap classes that are not in the model: they would silently wrap nothing but the root."""
    d = recipe.distributed
    fsdp = d.fsdp or FsdpSection()
    if d.strategy != "fsdp" or fsdp.auto_wrap_policy != "transformer":
        return []
    present = {type(m).__name__ for m in model.modules()}
    layers = sorted(n for n in present if n.endswith(("DecoderLayer", "EncoderLayer", "Block", "Layer")))
    if fsdp.transformer_layer_cls:
        missing = [c for c in fsdp.transformer_layer_cls if c not in present]
        if missing:
            return [Problem.at("distributed.fsdp.transformer_layer_cls",
                               f"wrap class{'es' if len(missing) > 1 else ''} {', '.join(missing)} not found in "
                               f"{type(model).__name__}",
                               f"layer classes in this model: {', '.join(layers) or 'none'}; "
                               "or leave transformer_layer_cls unset to use the model's _no_split_modules")]
        return []
    declared = list(getattr(model, "_no_split_modules", None) or [])
    if not any(c in present for c in declared):
        return [Problem.at("distributed.fsdp.auto_wrap_policy",
                           f"{type(model).__name__} declares no usable _no_split_modules "
                           f"({', '.join(declared) or 'none'}), so the transformer policy would wrap only the root",
                           f"set `distributed.fsdp.transformer_layer_cls` (classes in this model: "
                           f"{', '.join(layers) or 'none'}) or `auto_wrap_policy: size`")]
    return []
