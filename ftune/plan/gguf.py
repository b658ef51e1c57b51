"""`model.path` at a GGUF file: the compiler's decision (which file, which cached folder the run trains on).

The file is checked from its header and metadata (`ftune.gguf.inspect`: magic, version, tensors within the file,
an architecture transformers' GGUF loader supports); the recipe as it runs names the converted folder in the
cache (keyed by the file's sha256), and `plan.model_load.gguf` records the source. `ftune run` converts it in the
parent before launch (once: `ftune.launch.gguf.materialize`); `ftune plan` builds the model from a config.json read
from the metadata alone (`model.config`, unless the recipe sets one), so no weight is read to plan.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from ftune.errors import Problem
from ftune.recipe.schema import Recipe


class GgufSource(BaseModel):
    """The GGUF a run's model folder was converted from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: str
    sha256: str
    architecture: str
    name: str | None = None
    tensors: int
    version: int


def gguf_file(recipe: Recipe) -> tuple[Path, str] | None:
    """The GGUF file the recipe names and the key that names it, or None for a plain model folder."""
    m = recipe.model
    if m.gguf_file:
        return Path(m.path).expanduser() / m.gguf_file, "model.gguf_file"
    if m.path.lower().endswith(".gguf"):
        return Path(m.path).expanduser(), "model.path"
    return None


def resolve(recipe: Recipe, *, config: bool = True) -> tuple[Recipe, GgufSource | None, list[Problem]]:
    """The recipe as it runs (model.path at the converted folder), the source, and the problems found.

    `config`: also write (cached) the metadata's config.json and name it in `model.config`, for the estimate."""
    named = gguf_file(recipe)
    if named is None:
        return recipe, None, []
    file, key = named
    from ftune.gguf import GgufError, converted_folder, inspect

    if recipe.model.init == "random":
        return recipe, None, [Problem.at("model.init", "`init: random` builds a model from a config, but "
                                         f"{key} names a GGUF file (weights)",
                                         "drop model.init to fine-tune the GGUF's weights")]
    try:
        info = inspect(file)
    except GgufError as err:
        return recipe, None, [Problem.at(key, err.message, err.hint)]
    update: dict = {"path": str(converted_folder(info)), "gguf_file": None}
    if config and recipe.model.config is None:
        from ftune.gguf.convert import metadata_config

        update["config"] = str(metadata_config(info))
    source = GgufSource(file=str(info.file), sha256=info.sha256, architecture=info.architecture, name=info.name,
                        tensors=info.tensors, version=info.version)
    model = recipe.model.model_copy(update=update)
    return recipe.model_copy(update={"model": model}), source, []


def note(source: GgufSource, folder: str) -> str:
    return (f"model.path is a GGUF ({source.architecture}, {Path(source.file).name}): the run trains on its "
            f"dequantized copy {folder} (converted once before launch, cached by sha256 {source.sha256[:12]})")
