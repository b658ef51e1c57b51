"""Optimizer state bytes for `ftune plan`: the states each optimizer `train.optimizer` names keeps per parameter
(AdamW's two, 8-bit blockwise states, factored, none), GaLore's low-rank states, and the temporaries of a step."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ftune.estimate.facts import ParamFact

# bitsandbytes 8-bit optimizers: blockwise (256) quantized states, fp32 states below 4096 elements.
BNB_OPT_BLOCK = 256
BNB_MIN_8BIT_SIZE = 4096


# ------------------------------------------------------------------------------------------- optimizer
@dataclass(frozen=True)
class OptimizerSpec:
    label: str
    states: int  # full-size state tensors per parameter
    state_bytes: int | None = None  # bytes per state element; None: the parameter's dtype
    eight_bit: bool = False  # bitsandbytes blockwise 8-bit states
    step_tensor: bool = False  # torch keeps a 4-byte fp32 `step` tensor per parameter
    factored: bool = False  # Adafactor: row + column second moments for matrices
    no_gradients: bool = False  # LOMO-style: the update is fused into backward, no .grad is kept
    foreach: bool = False  # torch's default update: multi-tensor on GPU, single-tensor on CPU (see below)


def _adam(label: str, **kw) -> OptimizerSpec:
    return OptimizerSpec(label, 2, **kw)


OPTIMIZERS: dict[str, OptimizerSpec] = {
    "adamw_torch": _adam("AdamW (torch)", step_tensor=True, foreach=True),
    "adamw_torch_fused": _adam("AdamW (torch, fused)", step_tensor=True),
    "adamw_apex_fused": _adam("AdamW (apex, fused)", state_bytes=4),
    "adamw_anyprecision": _adam("AdamW (any precision)", step_tensor=True),
    "adamw_8bit": _adam("AdamW 8-bit (bitsandbytes)", eight_bit=True),
    "adamw_bnb_8bit": _adam("AdamW 8-bit (bitsandbytes)", eight_bit=True),
    "paged_adamw_8bit": _adam("paged AdamW 8-bit (bitsandbytes)", eight_bit=True),
    "paged_adamw_32bit": _adam("paged AdamW 32-bit (bitsandbytes)", state_bytes=4),
    "paged_adamw": _adam("paged AdamW 32-bit (bitsandbytes)", state_bytes=4),
    "adamw_torch_4bit": _adam("AdamW 4-bit (torchao)", state_bytes=1),
    "adamw_torch_8bit": _adam("AdamW 8-bit (torchao)", state_bytes=1),
    "ademamix": OptimizerSpec("AdEMAMix", 3, state_bytes=4),
    "ademamix_8bit": OptimizerSpec("AdEMAMix 8-bit", 3, eight_bit=True),
    "lion_8bit": OptimizerSpec("Lion 8-bit (bitsandbytes)", 1, eight_bit=True),
    "paged_lion_8bit": OptimizerSpec("paged Lion 8-bit (bitsandbytes)", 1, eight_bit=True),
    "lion_32bit": OptimizerSpec("Lion 32-bit (bitsandbytes)", 1, state_bytes=4),
    "paged_lion_32bit": OptimizerSpec("paged Lion 32-bit (bitsandbytes)", 1, state_bytes=4),
    "adafactor": OptimizerSpec("Adafactor", 0, factored=True),
    "sgd": OptimizerSpec("SGD (no momentum)", 0),
    "adagrad": OptimizerSpec("Adagrad", 1, step_tensor=True, foreach=True),
    "rmsprop": OptimizerSpec("RMSprop", 1, step_tensor=True, foreach=True),
    "lomo": OptimizerSpec("LOMO", 0, no_gradients=True),
    "adalomo": OptimizerSpec("AdaLOMO", 0, factored=True, no_gradients=True),
}
DEFAULT_OPTIMIZER = "adamw_torch"


def optimizer_spec(name: str) -> tuple[OptimizerSpec, bool]:
    """The spec for a transformers `optim` name, and whether it is known (unknown: AdamW assumed)."""
    if name in OPTIMIZERS:
        return OPTIMIZERS[name], True
    return OptimizerSpec(f"{name} (assumed AdamW-like)", 2, step_tensor=True), False


def optimizer_state_bytes(params: list[ParamFact], spec: OptimizerSpec) -> int:
    total = 0
    for p in params:
        if not p.trainable:
            continue
        n = p.numel
        if spec.factored:
            total += (p.shape[0] + p.shape[-1]) * 4 if len(p.shape) >= 2 else n * 4
        elif spec.eight_bit and n >= BNB_MIN_8BIT_SIZE:
            total += spec.states * (n + math.ceil(n / BNB_OPT_BLOCK) * 4 + 256 * 4)
        elif spec.eight_bit:
            total += spec.states * n * 4
        else:
            total += spec.states * n * (spec.state_bytes or p.itemsize)
        if spec.step_tensor:
            total += 4
    return total


def galore_targets(params: list[ParamFact], targets: tuple[str, ...] | str) -> set[str]:
    """The trainable matrices GaLore projects, matched as transformers matches `optim_target_modules`: a list by
    substring of the module name (or full regex match), a string by full regex match; `all-linear`: every
    matrix but the embeddings and the head."""
    out = set()
    for p in params:
        if not p.trainable or len(p.shape) != 2 or not p.name.endswith(".weight"):
            continue
        module = p.name[: -len(".weight")]
        if targets == "all-linear":
            hit = not any(k in module for k in ("embed", "lm_head", "wte", "wpe"))
        elif isinstance(targets, str):
            hit = re.fullmatch(targets, module) is not None
        else:
            hit = any(t in module or re.fullmatch(t, module) for t in targets)
        if hit:
            out.add(p.name)
    return out


def galore_low_rank(train) -> tuple[int, tuple[str, ...] | str] | None:
    """GaLore's rank (transformers' default 128) and target modules, from train.optimizer_args."""
    args = train.optimizer_args or {}
    if not train.optimizer.startswith("galore_") or "target_modules" not in args:
        return None
    return int(args.get("rank", 128)), (t if isinstance(t := args["target_modules"], str) else tuple(t))


def galore_state_bytes(params: list[ParamFact], rank: int, targets: tuple[str, ...] | str, eight_bit: bool) -> int:
    """GaLore keeps its Adam moments on the projected gradient: a projected m x n matrix holds r x max(m, n) per
    moment, plus its r x min(m, n) projector; other trainable tensors keep full-size moments."""
    projected = galore_targets(params, targets)
    total = 0
    for p in params:
        if not p.trainable:
            continue
        per = 1 if eight_bit else p.itemsize
        if p.name in projected:
            m, n = p.shape
            r = min(rank, m, n)
            total += 2 * r * max(m, n) * per + r * min(m, n) * p.itemsize
        else:
            total += 2 * p.numel * per
    return total


def optimizer_step_temporary(params: list[ParamFact], spec: OptimizerSpec, device: str) -> int:
    """Scratch the update allocates: a foreach update on GPU holds one state-sized copy (sqrt of the second
    moment for the whole group); torch's single-tensor update (CPU) two copies of the largest parameter
    (`exp_avg_sq.sqrt() / c`); fused and 8-bit kernels work in place."""
    trainable = [p.numel * p.itemsize for p in params if p.trainable]
    if not trainable or spec.states == 0:
        return 0
    if spec.foreach and device == "cuda":
        return sum(trainable)
    return 2 * max(trainable) if spec.foreach else 0
