"""The inputs a recipe names that aren't on this machine: the model and tokenizer folders (or, offline, their hub ids
in the Hugging Face cache: `ftune.hub`) and the data files (relative to the working directory), the accelerate and
DeepSpeed configs (relative to the recipe file). One wording for the compiler (`ftune.plan.checks.environment`) and
`ftune validate --check-paths`; light (no torch)."""

from __future__ import annotations

import os
from pathlib import Path

from ftune import hub
from ftune.errors import Problem
from ftune.datafiles.images import URL
from ftune.hub import looks_local
from ftune.recipe.schema import Recipe
from ftune.recipe.sources import sources

MODEL_FILES = ("config.json", "adapter_config.json")  # a model, or a saved adapter to continue
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def missing_inputs(recipe: Recipe, model_folder: bool = True) -> list[Problem]:
    """The local model folder, tokenizer folder and data files the recipe names that don't exist, and the hub ids
    the offline cache doesn't hold (`ftune.hub`): one wording for the compiler and `validate --check-paths` (which
    adds `missing_configs`)."""
    found: list[Problem] = []
    folders = [("model.path", "model", recipe.model.path, MODEL_FILES)] if model_folder else []
    if recipe.model.tokenizer:
        folders.append(("model.tokenizer", "tokenizer", recipe.model.tokenizer, hub.TOKENIZER_FILES))
    for key, what, value, markers in folders:
        if Path(value).expanduser().exists():
            continue
        if looks_local(value):
            found.append(Problem.at(key, f"{what} folder not found: {value}",
                                    f"point {key} at a local folder holding "
                                    + ("config.json" if what == "model" else "the tokenizer files")))
        else:
            found += cached_id(key, what, value, recipe, markers)
    for key, src in sources(recipe):
        if src.type == "hub":
            continue
        if URL.match(src.path):  # `file:///x.jsonl` was read as the relative folder `file:`
            found.append(Problem.at(f"{key}.path", f"{src.path} is a URL: data paths are local files (or a hub "
                                    "dataset's name with `type: hub`)",
                                    "download the file and name it by its path (relative to the working directory)"))
        elif src.is_glob:
            if not src.files():
                found.append(Problem.at(f"{key}.path", f"no file matches {src.path}",
                                        "paths are relative to the working directory "
                                        f"({os.getcwd()}); check the pattern"))
        elif not Path(src.path).expanduser().exists() and (looks_local(src.path) or src.type != "auto"):
            found.append(Problem.at(f"{key}.path", f"data file not found: {src.path}",
                                    "paths are relative to the working directory "
                                    f"({os.getcwd()}); check the spelling or run from the project root"))
    return found


def cached_id(key: str, what: str, value: str, recipe: Recipe, markers: tuple[str, ...]) -> list[Problem]:
    """A hub id offline: the cache holds its snapshot, and for the model (unless `model.tokenizer` names another
    one, or it is an adapter) the tokenizer and weights the run loads from it: `hf download ID config.json`, which
    is enough for `ftune plan`, is not enough for `ftune run`."""
    revision = recipe.model.revision
    problem = hub.missing(key, value, revision, what, markers)
    if problem is None and what == "model" and hub.offline() and hub.cached_file(value, "config.json", revision):
        needs = ([] if recipe.model.tokenizer else [hub.TOKENIZER_FILES]) + \
            ([] if recipe.model.init == "random" else [WEIGHT_FILES])
        problem = next(filter(None, (hub.missing(key, value, revision, what, files) for files in needs)), None)
    return [problem] if problem is not None else []


def missing_configs(recipe: Recipe, recipe_dir: Path) -> list[Problem]:
    """The accelerate and DeepSpeed config files the distributed section names, relative to the recipe file."""
    d = recipe.distributed
    named = [("distributed.accelerate_config", "accelerate", d.accelerate_config),
             ("distributed.deepspeed.config", "DeepSpeed", d.deepspeed.config if d.deepspeed is not None else None)]
    return [Problem.at(key, f"{what} config not found: {path}", "the path is relative to the recipe file")
            for key, what, value in named
            if value is not None and not (path := (recipe_dir / value).resolve()).is_file()]
