"""Checks that need the model's structure (not its weights), run on the meta device by the compiler.

LoRA targets that match nothing, FSDP wrap classes missing from the model, `data.max_seq_length` past the
model's positions and 4-bit shapes the CPU kernels can't run are `Problem`s at their recipe keys, reported
with every other pre-launch problem by `compile_plan` (so `plan`, `run --dry-run` and `run` refuse alike,
before the run dir is written).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ftune import hub
from ftune.errors import FtuneError, Problem, RecipeError
from ftune.models.config import linear_layer_names
from ftune.models.meta import MetaModel, build_meta_model, meta_model
from ftune.plan import parallelism, qat, quantization, tiling
from ftune.plan.ddp import ExpertsKind, experts_kind
from ftune.recipe.objectives import family_of
from ftune.recipe.schema import FsdpSection, Recipe


def config_is_local(recipe: Recipe) -> bool:
    """The model's config can be read without a hub: `model.path` is a folder holding config.json, or, offline, a
    hub id whose snapshot in the cache holds one (transformers reads it from there)."""
    m = recipe.model
    return (Path(m.path).expanduser() / "config.json").is_file() or (
        hub.offline() and hub.cached_file(m.path, "config.json", m.revision) is not None)


@dataclass
class Inspection:
    """What the compiler learns from the model on the meta device."""

    problems: list[Problem] = field(default_factory=list)
    experts: ExpertsKind | None = None
    """How the model holds its experts (the DDP decision, ftune.plan.ddp)."""
    wrap: list[str] | None = None
    """The layer classes FSDP wraps (`wrap_classes`)."""
    meta: MetaModel | None = None
    """The meta model inspected (None where none was built), handed on so `ftune plan`'s estimate doesn't build it
    again; nothing here changes it."""


def inspect(recipe: Recipe, device: str, continued: tuple[Recipe, str] | None = None, *, required: bool = True
            ) -> Inspection:
    """`problems` on the meta model, how it holds its experts and the layer classes FSDP wraps: one build, from the
    config the one resolver finds (`ftune.models.meta.resolve_config`: the model's folder, the HF cache, the hub
    when `required`, `model.config`, the catalog), so `plan` (without the inputs) and `run` decide alike.
    `continued`: the recipe as written and the adapter folder, when `recipe` continues an adapter. `required`: a
    config found nowhere is a problem (`run`); otherwise nothing is inspected (`plan` says so through its estimate,
    `data` and `eval` need no model)."""
    try:
        meta = meta_model(recipe, fetch=required)
    except RecipeError as err:  # at the key the resolver names (model.path, model.config, model.task)
        return Inspection(list(err.problems) if required else [])
    except FtuneError as err:  # an unreadable config: at the key that names the model
        return Inspection([Problem.at("model.path", err.message, err.hint)] if required else [])
    model = meta.model
    found = problems(recipe, device, model)
    if continued is not None:
        found += continued_target_problems(continued[0], recipe, continued[1], model)
    return Inspection(found, experts_kind(model), wrap_classes(recipe, model), meta)


def continued_target_problems(written: Recipe, recipe: Recipe, folder: str, model) -> list[Problem]:
    """`target_modules: all-linear` over an adapter being continued: what it means on this model (on an MoE,
    attention and the experts: target_parameters) must be what the adapter adapts, since continuing can neither add
    nor drop targets. The light check (ftune.plan.adapter) can't tell without the model."""
    cfg = written.peft
    if not cfg.adapts_linear_layers or cfg.target_modules != "all-linear" or recipe.peft.target_modules == "all-linear":
        return []
    from ftune.methods.lora import resolve_targets

    try:
        targets = resolve_targets(model, cfg)
    except RecipeError:  # all-linear itself can't apply here: target_problems says why, at its keys
        return []
    if targets.modules == "all-linear":  # a dense model: peft's expansion, every linear layer but the head
        head = model.get_output_embeddings()
        want_modules = {n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                        if _linear(m) and m is not head and n.rsplit(".", 1)[-1] not in ("score", "classifier")}
    else:
        want_modules = set(targets.modules)
    want_params = set(targets.parameters)
    have_modules, have_params = set(recipe.peft.target_modules), set(recipe.peft.target_parameters or [])
    if (want_modules, want_params) == (have_modules, have_params):
        return []

    def listed(modules: set[str], params: set[str]) -> str:
        return (f"target_modules {', '.join(sorted(modules)) or 'none'} and target_parameters "
                f"{', '.join(sorted(params)) or 'none'}")

    return [Problem.at("peft.target_modules",
                       f"all-linear on {type(model).__name__} adapts {listed(want_modules, want_params)}, but the "
                       f"adapter being continued ({folder}) adapts {listed(have_modules, have_params)}: a continued "
                       "adapter keeps its targets",
                       "remove peft.target_modules (the adapter's targets are kept), or point model.path at the base "
                       "model to train a new adapter with all-linear")]


def _linear(module) -> bool:
    import torch

    return isinstance(module, torch.nn.Linear)


def problems(recipe: Recipe, device: str, model=None) -> list[Problem]:
    """Every model-structure problem of `recipe` (as it runs: a continued adapter's base), on `model` (the meta
    model, built here from the config when not given). Errors and warnings (`severity`): the compiler refuses the
    errors and carries the warnings in `Plan.warnings`."""
    if model is None:
        try:
            model = build_meta_model(recipe)
        except FtuneError as err:  # an unreadable config: at the key that names the model
            return [Problem.at("model.path", err.message, err.hint)]
    found = target_problems(model, recipe) + wrap_class_problems(recipe, model) + position_problems(recipe, model)
    found += router_problems(recipe, model) + quantization.fused_expert_problems(recipe, model)
    found += completion_position_problems(recipe, model) + paged_layer_problems(recipe, model)
    found += parallelism.model_problems(recipe, model.config)
    found += tiling.model_problems(recipe, model)
    return found + quantization.check_model_config(recipe, model, device) + qat.model_problems(recipe, model)


def target_problems(model, recipe: Recipe) -> list[Problem]:
    """LoRA targets the model lacks (modules, parameters, experts on a dense model) and the settings peft can't
    apply to them: the same resolution the worker's inject runs (ftune.methods._lora_targets). When some
    target_modules entries match and others don't (a list written for another architecture, half of it silent),
    a warning names the ones that match nothing."""
    cfg = recipe.peft
    if not cfg.adapts_linear_layers:
        return []
    from ftune.methods.lora import target_problems as lora_problems

    found = lora_problems(model, cfg)
    if found or cfg.target_modules == "all-linear":
        return found
    names = [n for n, _ in model.named_modules()]
    unmatched = [t for t in cfg.target_modules
                 if not any(n == t or n.endswith("." + t) or re.fullmatch(t, n) for n in names)]
    if unmatched and len(unmatched) < len(cfg.target_modules):
        found.append(Problem(f"{', '.join(unmatched)} match{'es' if len(unmatched) == 1 else ''} no module of the "
                             "model (the other entries do, so LoRA trains those only)", path="peft.target_modules",
                             hint=target_hint(model), severity="warning"))
    return found


def router_problems(recipe: Recipe, model) -> list[Problem]:
    """Router settings on a model without a router: they would do nothing, silently."""
    from ftune.models.moe import moe_layout

    m = recipe.model
    written = [k for k in ("router_aux_loss_coef", "output_router_logits") if getattr(m, k) is not None]
    if not written or moe_layout(model) is not None:
        return []
    return [Problem.at(f"model.{k}", f"{type(model).__name__} has no router (it is not a mixture-of-experts "
                       "model), so model." + k + " does nothing", f"remove model.{k}") for k in written]


def position_problems(recipe: Recipe, model) -> list[Problem]:
    """data.max_seq_length past the model's positions: positions beyond them have no embedding (an index error
    mid-run) or were never trained (silently wrong), so training can't be right."""
    return length_problems(recipe, getattr(model, "config", None))


def length_problems(recipe: Recipe, config, longest: int | None = None) -> list[Problem]:
    """data.max_seq_length, or (unset) the data's `longest` tokenized row, past the positions `config` covers
    (`modeling.positions`: max_position_embeddings, stretched by a rope scaling factor where the config says so).
    The compiler's preflight and `ftune plan` (whose config may come from the cache or the catalog) ask here."""
    from ftune.models.config import positions

    length = recipe.data.max_seq_length or longest
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    found = positions(config) if config is not None else None
    if not length or found is None or length <= found[0]:
        return []
    limit, how = found
    what = f"{length} is" if recipe.data.max_seq_length else f"unset, and the data's longest row ({length:,} tokens) is"
    where = f"in {recipe.model.path}/config.json"
    covered = f"max_position_embeddings ({limit}, {where})" if how == "max_position_embeddings" else \
        f"{limit} positions ({how}, {where})"
    return [Problem.at("data.max_seq_length", f"{what} longer than the model's {covered}",
                       f"set data.max_seq_length to at most {limit} (longer rows are truncated)")]


def completion_position_problems(recipe: Recipe, model) -> list[Problem]:
    """grpo/rloo: the prompt (at most data.max_prompt_length tokens) plus max_completion_length past the model's
    positions: generation would run off the end. The data stage checks each prompt's real length."""
    rl = recipe.train.rl
    if rl is None or not family_of(recipe).generates:
        return []
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    positions = getattr(text, "max_position_embeddings", None)
    prompt = recipe.data.max_prompt_length or 1
    if not isinstance(positions, int) or positions <= 0 or prompt + rl.max_completion_length <= positions:
        return []
    what = f"data.max_prompt_length ({prompt}) + " if recipe.data.max_prompt_length else "a prompt + "
    return [Problem.at("train.rl.max_completion_length",
                       f"{what}max_completion_length ({rl.max_completion_length}) is longer than the model's "
                       f"max_position_embeddings ({positions}, in {recipe.model.path}/config.json)",
                       f"keep max_completion_length + the prompt within {positions} tokens")]


PAGED_LAYERS = ("full_attention", "sliding_attention")
"""The layer types transformers' paged cache has allocators for (a hybrid's linear-attention or mamba layers not)."""


def paged_layer_problems(recipe: Recipe, model) -> list[Problem]:
    """`train.rl.generation.backend: paged` on a model with layers the paged cache can't hold: transformers would
    raise at the first step's generation ("Invalid layer type")."""
    rl = recipe.train.rl
    if rl is None or not family_of(recipe).generates or rl.generation.backend != "paged":
        return []
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    other = sorted({t for t in getattr(text, "layer_types", None) or () if t not in PAGED_LAYERS})
    if not other:
        return []
    return [Problem.at("train.rl.generation.backend",
                       f"continuous batching (backend paged) caches full and sliding attention layers only; "
                       f"{recipe.model.path} also has {', '.join(other)} layers",
                       "use `backend: transformers` for this model")]


def target_hint(model) -> str:
    return (f"linear layers in this model: {', '.join(linear_layer_names(model))} "
            "(or use `peft.target_modules=all-linear`)")


def wrap_classes(recipe: Recipe, model) -> list[str] | None:
    """The layer classes FSDP's transformer policy wraps when `distributed.fsdp.transformer_layer_cls` is unset: the
    classes of the model's `_no_split_modules` that are in it, sorted. None when the recipe names them or FSDP
    doesn't wrap by class.

    Decided here, not by accelerate: a vision-language model's `_no_split_modules` gathers its towers' (LLaVA's:
    `CLIPEncoderLayer` and `LlamaDecoderLayer`, but also `CLIPTextEmbeddings`, which a vision-only CLIP lacks) and
    accelerate 1.15 refuses a class it can't find ("Could not find the transformer layer class"). Naming the present
    ones in the accelerate config wraps both the vision encoder's and the language decoder's layers."""
    d = recipe.distributed
    fsdp = d.fsdp or FsdpSection()
    if d.strategy != "fsdp" or fsdp.auto_wrap_policy != "transformer" or fsdp.transformer_layer_cls:
        return None
    present = {type(m).__name__ for m in model.modules()}
    classes = sorted(c for c in (getattr(model, "_no_split_modules", None) or []) if c in present)
    return classes or None


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
