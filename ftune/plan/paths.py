"""The local paths a recipe names that don't exist: the model and tokenizer folders and the data files (relative
to the working directory), the accelerate and DeepSpeed configs (relative to the recipe file). One wording for the
compiler (`ftune.plan.environment`) and `ftune validate --check-paths`; light (no torch)."""

from __future__ import annotations

import os
from pathlib import Path

from ftune.errors import Problem
from ftune.data.images import URL
from ftune.recipe.load import looks_local
from ftune.recipe.schema import Recipe
from ftune.recipe.sources import sources


def missing_inputs(recipe: Recipe, model_folder: bool = True) -> list[Problem]:
    """The local model folder, tokenizer folder and data files the recipe names that don't exist: one wording for
    the compiler and `validate --check-paths` (which adds `missing_configs`). A name that looks like a hub id is
    not local (unless the hub is offline)."""
    found: list[Problem] = []
    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    folders = [("model.path", "model", recipe.model.path)] if model_folder else []
    if recipe.model.tokenizer:
        folders.append(("model.tokenizer", "tokenizer", recipe.model.tokenizer))
    for key, what, value in folders:
        if not Path(value).expanduser().exists() and (looks_local(value) or offline):
            found.append(Problem.at(key, f"{what} folder not found: {value}",
                                    f"point {key} at a local folder holding "
                                    + ("config.json" if what == "model" else "the tokenizer files")
                                    + (" (the hub is offline: HF_HUB_OFFLINE=1)" if offline else "")))
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


def missing_configs(recipe: Recipe, recipe_dir: Path) -> list[Problem]:
    """The accelerate and DeepSpeed config files the distributed section names, relative to the recipe file."""
    d = recipe.distributed
    named = [("distributed.accelerate_config", "accelerate", d.accelerate_config),
             ("distributed.deepspeed.config", "DeepSpeed", d.deepspeed.config if d.deepspeed is not None else None)]
    return [Problem.at(key, f"{what} config not found: {path}", "the path is relative to the recipe file")
            for key, what, value in named
            if value is not None and not (path := (recipe_dir / value).resolve()).is_file()]
