"""What a LoRA recipe adapts, resolved against the model's real names (on the meta device before launch, on the
loaded model in the worker: the same function, so both agree): linear layers by name (`target_modules`), fused MoE
expert tensors and other parameters directly (`target_parameters`, peft's ParamWrapper), the router, and the
dropout peft can apply to them.

Why ftune resolves the names itself: peft 0.21 rewrites the `target_modules` of MoE models it knows (v4 -> v5
names: `gate_proj`/`up_proj`/`down_proj` -> the fused `gate_up_proj`/`down_proj` expert tensors, `gate` -> the
router's weight). A linear layer with one of those leaf names that is *not* a routed expert (a shared expert, the
dense MLP of DeepSeek's first layer) would be re-mapped onto the experts and silently left untrained. So such
layers are targeted through `target_parameters` (`<module>.weight`), which peft leaves alone, and every resolved
target is checked to exist.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

from ftune.errors import Problem

AUTO_DROPOUT_NOTE = ("peft.dropout is 0 (not the default 0.05): LoRA on expert tensors (peft's ParamWrapper) "
                     "can't apply dropout, and one dropout serves every target")


@dataclass(frozen=True)
class Targets:
    modules: list[str] | str
    """peft target_modules: the recipe's names (or `all-linear` on a dense model), less those peft would rename."""
    parameters: list[str]
    """peft target_parameters: name suffixes of parameters adapted directly (experts, router, renamed linears)."""
    modules_to_save: list[str] | None
    dropout: float
    notes: list[str] = field(default_factory=list)

    @property
    def adapts_parameters(self) -> bool:
        return bool(self.parameters)


def _renamed_by_peft(model) -> set[str]:
    """Leaf names that peft's v4 -> v5 MoE conversion re-maps for this model type (empty when it has none)."""
    try:
        from peft.utils.transformers_weight_conversion import _MOE_TARGET_MODULE_MAPPING
        from transformers.conversion_mapping import _MODEL_TO_CONVERSION_PATTERN
    except ImportError:
        return set()
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    base = _MODEL_TO_CONVERSION_PATTERN.get(model_type, model_type)
    return set(_MOE_TARGET_MODULE_MAPPING.get(base, {}))


def _linear_modules(model) -> dict[str, str]:
    """Full name -> leaf name of every nn.Linear but the output head (what `all-linear` means)."""
    import torch

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return {n: n.rsplit(".", 1)[-1] for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and m is not head and n}


def _suffixes(full: list[str], every: list[str]) -> list[str]:
    """Short name suffixes (the layer index dropped: `mlp.experts.gate_up_proj`) that match exactly `full` among
    `every` (peft matches a target by name or `.`-suffix); the full names where a suffix would match more."""
    wanted = set(full)
    short = sorted({re.sub(r"^.*?\.\d+\.", "", n) for n in full})
    hit = {n for n in every if any(n == s or n.endswith("." + s) for s in short)}
    return short if hit == wanted else sorted(wanted)


def _did_you_mean(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.5)
    return f"did you mean {' or '.join(close)}? " if close else ""


def resolve(model, cfg) -> tuple[Targets, list[Problem]]:
    """The LoRA targets of recipe section `cfg` on `model`, and the problems that stop it (located keys)."""
    from ftune.models.vision_parts import is_vision_language
    from ftune.models.moe import moe_layout

    if is_vision_language(getattr(getattr(model, "config", None), "model_type", None)):
        return _vision(model, cfg)
    layout = moe_layout(model)
    problems: list[Problem] = []
    notes: list[str] = []
    params = [n for n, _ in model.named_parameters()]
    linears = _linear_modules(model)
    renamed = _renamed_by_peft(model)
    routers = set(layout.router_modules) if layout else set()
    shared = set(layout.shared_linears) if layout else set()

    # linear layers: all-linear (the router aside: peft.router decides it) or the names written
    experts = bool(cfg.experts) or (cfg.target_modules == "all-linear" and layout is not None)
    if cfg.target_modules == "all-linear":
        chosen = {n for n in linears if n not in routers}
    else:
        chosen = {n for n, leaf in linears.items() if n not in routers
                  and any(n == t or n.endswith("." + t) for t in cfg.target_modules)}
    by_param = {n for n in chosen if linears[n] in renamed}  # peft would re-map these onto the experts
    if experts and layout is not None:
        by_param |= shared
    modules: list[str] | str
    if cfg.target_modules == "all-linear":
        modules = "all-linear" if layout is None and not by_param else sorted({linears[n] for n in chosen - by_param})
    else:
        modules = [t for t in cfg.target_modules if t.rsplit(".", 1)[-1] not in renamed]
        names = [n for n, _ in model.named_modules()]
        for t in cfg.target_modules:
            if layout is not None and any(b.experts == t or b.experts.endswith("." + t) for b in layout.blocks):
                problems.append(Problem.at("peft.target_modules", f"{t!r} is the fused experts module (tensors of "
                                           "shape [experts, ...]), not a linear layer", "use `peft.experts: true`"))
                modules.remove(t)
                continue
            if t.rsplit(".", 1)[-1] in renamed and not any(n == t or n.endswith("." + t) for n in chosen):
                fix = "`peft.router: lora`" if t.rsplit(".", 1)[-1] in ("gate", "router") else "`peft.experts: true`"
                problems.append(Problem.at("peft.target_modules", f"{t!r} is no linear layer of "
                                           f"{type(model).__name__}: transformers 5 fuses the experts into "
                                           "[experts, ...] tensors and makes the router its own module",
                                           f"use {fix} (or name tensors in peft.target_parameters)"))
        if modules and not by_param and not any(any(n == t or n.endswith("." + t) or re.fullmatch(t, n)
                                                    for n in names) for t in modules):
            import torch

            every = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
            problems.append(Problem.at("peft.target_modules", f"({', '.join(cfg.target_modules)}) matches "
                                       "no module of the model",
                                       f"the model's linear layers are: {', '.join(every)}"))
    if cfg.experts and layout is None:
        problems.append(Problem.at("peft.experts", f"{type(model).__name__} has no mixture-of-experts layers "
                                   "(no fused `experts` tensors), so `experts: true` adapts nothing",
                                   "remove peft.experts (it is for MoE models such as Qwen3-MoE, Mixtral, OLMoE)"))
    if cfg.router != "frozen" and layout is None:
        problems.append(Problem.at("peft.router", f"{type(model).__name__} has no router (it is not a "
                                   "mixture-of-experts model)", "remove peft.router"))
    parameters: list[str] = []
    if experts and layout is not None:
        parameters += _suffixes(layout.expert_tensors, params)
    if by_param:
        parameters += _suffixes([f"{n}.weight" for n in by_param], params)
    if cfg.router == "lora" and layout is not None:
        parameters += _suffixes([f"{r}.weight" for r in layout.router_modules], params)
    for wanted in cfg.target_parameters or []:
        if not any(p == wanted or p.endswith("." + wanted) for p in params):
            leaves = sorted({re.sub(r"^.*?\.\d+\.", "", p) for p in params})
            problems.append(Problem.at("peft.target_parameters", f"{wanted!r} names no parameter of "
                                       f"{type(model).__name__}",
                                       f"{_did_you_mean(wanted, leaves)}parameters look like: "
                                       f"{', '.join(leaves[:8])}"))
        elif wanted not in parameters:
            parameters.append(wanted)
    modules_to_save = list(cfg.modules_to_save) if cfg.modules_to_save else []
    if cfg.router == "full" and layout is not None:
        # parent.leaf (`mlp.gate`): peft matches modules_to_save as a plain suffix, and `gate` alone would also
        # catch `shared_expert_gate`
        modules_to_save += sorted({".".join(r.split(".")[-2:]) for r in layout.router_modules} - set(modules_to_save))

    dropout = cfg.dropout
    if parameters and dropout:
        if "dropout" in cfg.model_fields_set:
            problems.append(Problem.at("peft.dropout", f"{dropout}, but LoRA on "
                                       f"{_what(parameters)} (peft's ParamWrapper) can't apply dropout, and one "
                                       "dropout serves every target", "set `peft.dropout: 0`"))
        else:
            dropout = 0.0
            notes.append(AUTO_DROPOUT_NOTE)
    if parameters and cfg.use_dora:
        problems.append(Problem.at("peft.use_dora", f"DoRA does not work on {_what(parameters)} (peft's "
                                   "ParamWrapper)", "remove peft.use_dora, or adapt linear layers only"))
    return Targets(modules, parameters, modules_to_save or None, dropout, notes), problems


def _vision(model, cfg) -> tuple[Targets, list[Problem]]:
    """A vision-language model: per part (`peft.modules`, ftune.models.vision_parts.part_of), LoRA on the linear layers of
    the `lora` parts that `target_modules` names (all of them with `all-linear`), the `full` parts' top modules saved
    whole (peft modules_to_save), the rest frozen. Targets are full module names, so no part leaks into another."""
    from ftune.methods._base import VisionModules
    from ftune.models.vision_parts import PARTS, called, outermost, part_of

    kind = model.config.model_type
    modes = cfg.modules or VisionModules()
    problems: list[Problem] = []
    written = cfg.target_modules != "all-linear"
    lora_parts = {p for p in PARTS if modes.of(p) == "lora"}
    chosen = sorted(n for n, leaf in _linear_modules(model).items() if part_of(n, kind) in lora_parts
                    and (not written or any(n == t or n.endswith("." + t) for t in cfg.target_modules)))
    for part in sorted(lora_parts):
        if not any(part_of(n, kind) == part for n in chosen):
            problems.append(Problem.at("peft.target_modules" if written else "peft.modules",
                                       f"peft.modules.{part} is lora, but no linear layer of the {part} part of "
                                       f"{type(model).__name__} is a target",
                                       "name that part's layers in peft.target_modules (`all-linear`: every linear "
                                       f"layer), or set peft.modules.{part}: full or frozen"))
    whole = {p for p in PARTS if modes.of(p) == "full"}
    tops = called(dict(model.named_modules()), outermost([n for n, _ in model.named_parameters()], kind, whole))
    if not chosen and not tops:
        problems.append(Problem.at("peft.modules", f"every part of {type(model).__name__} is frozen: nothing trains",
                                   "set at least one of peft.modules.vision / projector / language to lora or full"))
    extra = list(cfg.modules_to_save or [])
    return Targets(chosen, [], (tops + [m for m in extra if m not in tops]) or None, cfg.dropout), problems


def _what(parameters: list[str]) -> str:
    shown = ", ".join(parameters[:3]) + (", ..." if len(parameters) > 3 else "")
    return f"parameters ({shown})"
