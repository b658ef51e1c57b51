"""The recipe's base model on the meta device, from its config alone (no weights): which config.json to read
(the model's own, the HF cache, the hub when a run may fetch it, `model.config`, the bundled catalog), its dtype,
and the build. The one resolver and the one builder of the compiler's preflight (so `plan` and `run` compile the
same Plan: FSDP wrap classes, DDP's unused parameters), the quantization checks and the estimator.
A problem at a recipe key is a `RecipeError` of unlocated `Problem`s: the caller locates them in its recipe."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ftune import hub
from ftune.errors import FtuneError, Problem, RecipeError
from ftune.models import catalog

DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2}


def resolve_config(recipe, *, fetch: bool = False) -> tuple[Path, str]:
    """The config.json to build from, in this order: `model.path` as a local folder or file, the HF cache, the
    hub (only with `fetch`, online: `run` reads what the worker will load), `model.config`, the bundled catalog (by
    id, or by name for mirrors and variants).

    The model's own config wins; `model.config` is what the user names for everything else, so it comes
    before the catalog's match by name.
    """
    path = recipe.model.path
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise FtuneError(f"model folder {path} has no config.json", hint="point model.path at a HF model folder")
        return local / "config.json", f"local {local}"
    if local.is_file() and local.name.endswith(".json"):
        return local, f"local {local}"
    cached = hub.cached_file(path, "config.json", recipe.model.revision)
    if cached is not None:
        return cached, f"hf-cache {cached}"
    if fetch and not hub.offline() and not hub.looks_local(path):
        fetched = _fetch(path, recipe.model.revision)
        if fetched is not None:
            return fetched, f"hub {path}"
    if recipe.model.config is not None:
        return _own_config(recipe.model.config)
    vision = recipe.model.task == catalog.VISION_TASK
    found = catalog.lookup(path, vision)
    if found is not None:
        return found[1], f"catalog {'vision/' if vision else ''}{found[1].name}"
    other = catalog.lookup(path, not vision)
    if other is not None:  # in the other catalog: the task, not the name, is what's wrong
        what = ("a vision-language model", f"set model.task: {catalog.VISION_TASK}") if not vision else \
            ("a text-only model", "name a vision-language model (docs/vision-plan.md lists the catalog's), or set "
                                  "model.task: causal-lm")
        raise RecipeError([Problem.at("model.task", f"{path!r} is {what[0]} in the catalog ({other[0]}), but "
                                      f"model.task is {recipe.model.task!r}", what[1])])
    if str(path).lower().endswith(".gguf"):  # a llama.cpp file: there is nothing to download to make it trainable
        raise RecipeError([Problem.at("model.path", f"{path!r} is a GGUF file (llama.cpp's format): ftune fine-tunes "
                                      "Hugging Face models (config.json and safetensors weights)",
                                      "point model.path at the original HF model folder (or its hub id) the GGUF "
                                      "was converted from")])
    from ftune.hub import looks_local

    if looks_local(path):  # a folder that isn't there: never suggest downloading a path
        where = "" if Path(path).expanduser().is_absolute() else f" (relative to the working directory, {Path.cwd()})"
        raise RecipeError([Problem.at("model.path", f"model folder not found: {path}{where}",
                                      "check the folder: model.path must be a folder holding config.json (or set "
                                      "model.config to the model's config.json to plan without its weights)")])
    near = catalog.near(path, vision=vision)
    guess = f"did you mean {' or '.join(filter(None, [', '.join(near[:-1]), near[-1]]))}? Otherwise " if near else ""
    raise RecipeError([Problem.at(
        "model.path",
        f"no config found for {path!r}: not a local folder, not in the HF cache (searched {hub.repo_folder(path)}"
        + (f" at revision {recipe.model.revision}" if recipe.model.revision else "") + "), not in the catalog",
        f"{guess}set model.config to a local config.json of the model, or fetch it once "
        f"(`hf download {path} config.json`); the catalog (docs/plan.md) matches a name under its own org "
        f"or a mirror ({', '.join(catalog.MIRROR_ORGS)})",
    )])


def _own_config(value: str) -> tuple[Path, str]:
    """`model.config`: a config.json, or a folder holding one."""
    file = Path(value).expanduser()
    if file.is_dir():
        if not (file / "config.json").is_file():
            raise RecipeError([Problem.at("model.config", f"{value!r} is a folder with no config.json in it",
                                          "name the model's config.json, or a folder holding one")])
        file = file / "config.json"
    if not file.is_file():
        raise RecipeError([Problem.at("model.config", f"{value!r} does not exist", "name a config.json (or a folder "
                                      "holding one); a relative path is relative to the working directory")])
    return file, f"model.config {file}"


def resolve_dtype(recipe, config) -> str:
    if recipe.model.dtype != "auto":
        return recipe.model.dtype
    own = getattr(config, "dtype", None)
    name = str(own).removeprefix("torch.") if own is not None else "float32"
    return name if name in DTYPES else "float32"


def _fetch(repo_id: str, revision: str | None) -> Path | None:
    """The id's config.json from the hub (into the cache, as the worker's load would), or None where the hub can't
    give it: the resolver goes on to `model.config` and the catalog."""
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(repo_id, "config.json", revision=revision))
    except Exception:  # unreachable, gated, missing: what the run would meet is the model check's to say
        return None


def read_config(recipe, config_file: Path):
    """The config at `config_file` with the recipe's task settings (`ftune.models.config.apply_task`, as the worker
    loads it). A model's own folder is read as a folder, so its remote code (`trust_remote_code`) is found."""
    from transformers import AutoConfig

    from ftune.models.config import apply_task

    source = config_file.parent if config_file.name == "config.json" else config_file
    try:
        config = AutoConfig.from_pretrained(str(source), trust_remote_code=recipe.model.trust_remote_code)
    except (ValueError, KeyError, OSError) as e:
        raise FtuneError(f"cannot read model config {config_file}: {e}", hint="set model.trust_remote_code "
                         "if the model ships its own code") from None
    return apply_task(config, recipe)


@dataclass
class MetaModel:
    """The recipe's base model on the meta device, the config it was built from, its dtype name and where the
    config came from (`local ...`, `hf-cache ...`, `hub ...`, `model.config ...`, `catalog ...`, `given`)."""

    model: object
    config: object
    dtype: str
    source: str


def meta_model(recipe, config=None, *, fetch: bool = False) -> MetaModel:
    """The one meta-device build: from `config` when given (already as the run loads it), else from the config the
    resolver finds (`resolve_config`, read with the recipe's task settings)."""
    source = "given"
    if config is None:
        file, source = resolve_config(recipe, fetch=fetch)
        config = read_config(recipe, file)
    model, dtype = _instantiate(recipe, config)
    return MetaModel(model, config, dtype, source)


def build_meta_model(recipe, config=None, *, fetch: bool = False):
    """The model on the meta device: shapes and names only, no weights read, no memory used (`meta_model`)."""
    return meta_model(recipe, config, fetch=fetch).model


def _build(recipe, config_file: Path):
    """The recipe's base model on the meta device from `config_file`. Returns (model, config, dtype name)."""
    built = meta_model(recipe, read_config(recipe, config_file))
    return built.model, built.config, built.dtype


def _instantiate(recipe, config):
    """`config`'s model for the recipe's task on the meta device, in its dtype. Returns (model, dtype name)."""
    import torch
    import transformers

    from ftune.models.config import TASK_CLASSES

    remote = recipe.model.trust_remote_code
    dtype = resolve_dtype(recipe, config)
    if (init := recipe.model.init_from) is not None:  # the student the worker builds from these layers
        text = config.get_text_config()
        text.num_hidden_layers = len(init.layers)
        if isinstance(getattr(text, "layer_types", None), list) and max(init.layers) < len(text.layer_types):
            text.layer_types = [text.layer_types[i] for i in init.layers]
    auto = getattr(transformers, TASK_CLASSES[recipe.model.task])
    attn = "eager" if recipe.model.attn_implementation == "eager" else "sdpa"

    def build(attn: str):
        with torch.device("meta"):
            return auto.from_config(config, dtype=getattr(torch, dtype), attn_implementation=attn,
                                    trust_remote_code=remote)

    try:
        try:
            model = build(attn)
        except ValueError as e:  # no SDPA (Gemma 2's softcapping): transformers' own default is eager
            if attn != "sdpa" or recipe.model.attn_implementation == "sdpa" or "scaled_dot_product" not in str(e):
                raise
            model = build("eager")
    except (ValueError, ImportError, RuntimeError, TypeError) as e:
        raise FtuneError(f"cannot build {recipe.model.path} on the meta device: {e}",
                         hint="check model.task and model.trust_remote_code for this architecture") from None
    return model, dtype
