"""Continuing an adapter: `model.path` at a saved adapter folder (a run's final/, a checkpoint) trains that adapter
on, over the base it was trained on; it never stacks a second adapter.

The compiler decides it here, so the Plan says it: `model_load.path` is the adapter's base (resolved),
`model_load.adapter` the folder the peft stage loads trainable, and `plan.recipe` the recipe as it runs (its
model.path the base, its `peft:` section the adapter's: keys the recipe leaves unset are taken from the adapter,
keys it sets must agree). Light: json only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import ValidationError

from ftune import adapter, hub
from ftune.errors import FtuneError, Problem
from ftune.methods import METHODS, method_module
from ftune.plan.checks.model_files import safetensors_problem
from ftune.hub import looks_local
from ftune.recipe.schema import Recipe

NEW_ADAPTER = "or point model.path at a base model to train a new adapter"


def continue_adapter(recipe: Recipe) -> tuple[Recipe, str | None, list[Problem]]:
    """(the recipe as it runs, the adapter folder to continue or None, problems). A recipe whose model.path is
    not an adapter folder comes back unchanged. A hub id of an adapter is its snapshot in the Hugging Face cache."""
    m = recipe.model
    folder = hub.folder(m.path, m.revision, adapter.ADAPTER_CONFIG) or Path(m.path).expanduser()
    if not adapter.is_adapter(folder):
        return recipe, None, []
    folder = folder.resolve()
    try:
        saved = adapter.read(folder)
    except FtuneError as err:
        return recipe, None, [Problem.at("model.path", err.message, "copy the adapter folder again, or point "
                                         "model.path at a base model")]
    problems: list[Problem] = []
    for file in sorted(folder.glob("*.safetensors")):
        if (cut := safetensors_problem(file)) is not None:
            problems.append(Problem.at("model.path", cut, "the adapter was cut short (a full disk, an interrupted "
                                       "copy): copy it again, or continue a complete checkpoint"))
    if recipe.model.init == "random":
        problems.append(Problem.at("model.init", f"model.init: random builds an untrained model, but model.path "
                                   f"({folder}) is a trained adapter to continue", "remove model.init"))
    if saved.task and saved.task != recipe.model.task:
        problems.append(Problem.at("model.task", f"the adapter being continued ({folder}) was trained for model.task "
                                   f"{saved.task}; this recipe says {recipe.model.task}",
                                   f"set `model.task: {saved.task}`, {NEW_ADAPTER}"))
    base = _base(saved, problems)
    peft = _peft(recipe, saved, problems)
    if problems:
        return recipe, None, problems
    model = recipe.model.model_copy(update={"path": base})
    return recipe.model_copy(update={"model": model, "peft": peft}), str(folder), []


def _base(saved: adapter.SavedAdapter, problems: list[Problem]) -> str:
    """The base the adapter was trained on: a local folder (made absolute: relative paths are relative to the
    working directory, as model.path is) or a hub id."""
    where = f"{saved.folder}/{adapter.RECORD if saved.record.get('base_model') else adapter.ADAPTER_CONFIG}"
    base = saved.base
    if not base:
        problems.append(Problem.at("model.path", f"the adapter in {saved.folder} names no base model (its "
                                   f"{adapter.ADAPTER_CONFIG} has no base_model_name_or_path)",
                                   "set base_model_name_or_path in it to the model it was trained on, or merge it "
                                   "(`ftune merge RUN_DIR`) and point model.path at the merged folder"))
        return ""
    local = Path(base).expanduser()
    if local.exists():
        return str(local.resolve())
    if looks_local(base):
        relative = "" if local.is_absolute() else f" (relative to the working directory, {os.getcwd()})"
        problems.append(Problem.at("model.path", f"the base model of the adapter being continued is not found: "
                                   f"{base}{relative}, as {where} names it",
                                   "run from the folder the first run ran in, or copy the base model there; "
                                   "or merge the adapter (`ftune merge RUN_DIR`) and point model.path at the "
                                   "merged folder, which needs no base"))
    elif (problem := hub.missing("model.path", base, what=f"the base model (as {where} names it) of the adapter"
                                 )) is not None:
        problems.append(problem)
    return base


def _same(key: str, mine, theirs) -> bool:
    if isinstance(mine, list | tuple) and isinstance(theirs, list | tuple):
        if key == "modules_to_save":  # peft adds the classification head (score, classifier) itself
            return set(mine) <= set(theirs)
        return sorted(mine) == sorted(theirs)
    return mine == theirs


def _peft(recipe: Recipe, saved: adapter.SavedAdapter, problems: list[Problem]):
    """The recipe's `peft:` section checked against the adapter, with the keys it leaves unset taken from it."""
    cfg = recipe.peft
    kinds = {getattr(method_module(name), "PEFT_TYPE", None): name for name in METHODS}
    method = kinds.get(saved.peft_type)
    if not cfg.uses_peft_library:
        problems.append(Problem.at("peft.method", f"peft.method {cfg.method} trains the model's own weights, but "
                                   f"model.path ({saved.folder}) is an adapter, which has none of them",
                                   "merge it first (`ftune merge RUN_DIR`) and point model.path at the merged "
                                   f"folder" + (f", or set `peft.method: {method}` to continue the adapter"
                                                if method else "")))
        return cfg
    if method is None:
        problems.append(Problem.at("model.path", f"{saved.folder} holds an adapter of peft type "
                                   f"{saved.peft_type}, which ftune can't continue (it continues lora, prefix and "
                                   "llama-adapter adapters)",
                                   f"merge it into its base and point model.path at the result, {NEW_ADAPTER}"))
        return cfg
    written = cfg.model_fields_set
    if cfg.method != method:
        if "method" in written:
            problems.append(Problem.at("peft.method", f"the adapter being continued ({saved.folder}) is a {method} "
                                       f"adapter; peft.method is {cfg.method}",
                                       f"set `peft.method: {method}` (or remove the peft section), {NEW_ADAPTER}"))
            return cfg
        written = set()  # no peft section: the adapter's method, with its keys
    module = method_module(method)
    fixed = module.from_adapter(saved.config)
    if getattr(cfg, "target_modules", None) == "all-linear" and isinstance(fixed.get("target_modules"), list):
        # what all-linear means depends on the model (on an MoE: the experts too): the meta-model check compares
        # it with the adapter's targets (ftune.plan.checks.preflight.continued_target_problems); the adapter's are kept
        written = written - {"target_modules"}
    adjustable = getattr(module, "ADJUSTABLE", ())
    for key, value in fixed.items():
        mine = getattr(cfg, key, None)
        if key in written and key not in adjustable and not _same(key, mine, value):
            problems.append(Problem.at(f"peft.{key}", f"peft.{key} is {json.dumps(mine)}, but the adapter being "
                                       f"continued ({saved.folder}) has {key}={json.dumps(value)}",
                                       f"remove peft.{key} (it is taken from the adapter), {NEW_ADAPTER}"))
    if "init" in written and getattr(cfg, "init", "default") != "default":
        problems.append(Problem.at("peft.init", f"peft.init {cfg.init} initialises a new adapter, but the adapter "
                                   f"being continued ({saved.folder}) starts from its trained weights",
                                   f"remove peft.init, {NEW_ADAPTER}"))
    data = {**{k: getattr(cfg, k) for k in written if k != "method"},
            **{k: v for k, v in fixed.items() if k not in written and v is not None}, "method": method}
    try:
        return module.Config.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        problems.append(Problem.at("model.path", f"the adapter in {saved.folder} has a {key} that a recipe can't "
                                   f"express: {first['msg']}", f"merge it into its base and point model.path at "
                                   f"the result, {NEW_ADAPTER}"))
        return cfg
