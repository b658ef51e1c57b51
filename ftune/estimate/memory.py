"""Byte accounting for `ftune plan`: weights, gradients, optimizer states, activations, sharding.

Pure functions of parameter facts (shape, dtype, trainable, quantized) and an activation profile
(measured by `ftune.estimate.probe`), so they are unit-tested without torch and re-run cheaply for the
what-if suggestions ("with checkpointing the peak would be ...").
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from ftune.estimate.facts import ActivationProfile, MemoryItem, ParamFact
from ftune.estimate.optimizer import (DEFAULT_OPTIMIZER, galore_state_bytes, optimizer_spec, optimizer_state_bytes,
                                       optimizer_step_temporary)
from ftune.estimate.units import GiB, fmt_bytes, parse_bytes  # noqa: F401  (the names callers import from here)

# 4-bit (bitsandbytes Params4bit): 2 values per byte, one fp32 absmax per block of 64 values; with double
# quantization the absmax are 8-bit, with one fp32 absmax per 256 of them and a 256-entry fp32 code.
NF4_BLOCK = 64
NESTED_BLOCK = 256
# cuBLAS keeps one workspace per (thread, stream) handle: the forward runs on the main thread, the backward on
# autograd's device thread, so training holds two. torch's default size on Hopper is 32 MiB each; measured on an H200
# (torch 2.11): a tiny model's peak was 61 MiB over the tensors the plan counts. CUBLAS_WORKSPACE_CONFIG
# (":SIZE_KiB:COUNT" pairs) overrides the size, as it does for torch.
CUBLAS_HANDLES = 2
CUBLAS_DEFAULT_WORKSPACE = 32 * 1024**2


# --------------------------------------------------------------------------------------------- weights
def quantized_weight_bytes(p: ParamFact, double_quant: bool) -> int:
    """Bytes bitsandbytes stores for a quantized weight, constants included."""
    n = p.numel
    if p.quant == "int8":
        return n + p.shape[0] * 4  # int8 values + one fp32 scale per output row (SCB)
    blocks = math.ceil(n / NF4_BLOCK)
    if double_quant:
        constants = blocks + math.ceil(blocks / NESTED_BLOCK) * 4 + NESTED_BLOCK * 4 + 4
    else:
        constants = blocks * 4
    return math.ceil(n / 2) + constants + 16 * 4  # + the 16-entry code of nf4/fp4


def weight_bytes(p: ParamFact, double_quant: bool = False) -> int:
    return quantized_weight_bytes(p, double_quant) if p.quant else p.numel * p.itemsize


def weights_by_dtype(params: list[ParamFact], double_quant: bool = False) -> dict[str, int]:
    """Weight bytes grouped by storage: dtype names, or `nf4`/`fp4`/`int8` for quantized weights."""
    out: dict[str, int] = {}
    for p in params:
        key = p.quant or p.dtype
        out[key] = out.get(key, 0) + weight_bytes(p, double_quant)
    return out


def gradient_bytes(params: list[ParamFact]) -> int:
    """Gradients have the dtype of their parameter."""
    return sum(p.numel * p.itemsize for p in params if p.trainable)


# ------------------------------------------------------------------------------------------- per device
TILE_SLICE = "one MLP slice recomputed in backward (train.tiled_mlp)"


@dataclass(frozen=True)
class Layout:
    """The knobs that decide what one device holds."""

    optimizer: str = DEFAULT_OPTIMIZER
    checkpointing: bool = False
    device: str = "cuda"  # cuda | cpu
    strategy: str = "none"  # none | ddp | fsdp | deepspeed
    shard_ranks: int = 1  # ranks one shard group spans (FSDP/ZeRO); 1 = nothing sharded
    fsdp_sharding: str = "full_shard"
    fsdp_offload: bool = False
    largest_unit_bytes: int = 0  # FSDP: the largest non-root unit, all-gathered while it computes
    root_unit_bytes: int = 0  # FSDP: the root unit's own parameters, gathered for the whole step
    largest_unit_grad_bytes: int = 0
    zero_stage: int = 0
    offload_optimizer: bool = False
    offload_params: bool = False
    master_weights: bool = False  # DeepSpeed mixed precision keeps fp32 copies of trainable weights
    double_quant: bool = False
    fused_loss: bool = False  # Liger's fused linear cross-entropy: logits and their gradients never materialised
    loss_slices: int = 0  # train.tiled_loss: the head and loss in this many slices, recomputed in backward (0: not)
    offload_activations: bool = False  # saved activations live in host memory between forward and backward
    reference_copy: str | None = None  # dpo/kto with full fine-tuning: a frozen copy of the weights (the objective)
    low_rank: tuple[int, tuple[str, ...] | str] | None = None  # GaLore: (rank, optimizer_args.target_modules)


@dataclass(frozen=True)
class DeviceMemory:
    items: tuple[MemoryItem, ...]
    peak_phase: str
    """`backward` (activations, head gradient) or `update` (gradients, update scratch): whichever is larger."""
    total: int
    """Peak bytes: the `always` items plus those of the peak phase."""
    offloaded: int
    """Bytes moved to host memory by offload options."""
    offloaded_activations: int = 0
    """Of `offloaded`, the saved activations (`train.activation_offloading`): the part that grows with the row; the
    rest (FSDP's or DeepSpeed's offloaded states) stays the same."""

    def at_peak(self, item: MemoryItem) -> bool:
        return item.phase in ("always", self.peak_phase)


def per_device(params: list[ParamFact], profile: ActivationProfile, layout: Layout) -> DeviceMemory:
    """Peak bytes on one device: weights + optimizer states, plus the larger of the backward phase
    (activations and the head's gradient) and the update phase (gradients and the update's scratch)."""
    spec, _ = optimizer_spec(layout.optimizer)
    if layout.fused_loss:  # the head's saved fp32 log-probs and backward's two logits-sized gradients go away
        profile = replace(profile, outside_bytes=max(profile.outside_bytes - profile.head_bytes, 0), head_bytes=0)
    elif layout.loss_slices:  # nothing of the head kept from forward; one slice's log-probs recomputed in backward
        profile = profile.loss_tiled(layout.loss_slices)
    n = max(layout.shard_ranks, 1)
    by_dtype = weights_by_dtype(params, layout.double_quant)
    w_total = sum(by_dtype.values())
    grads = 0 if spec.no_gradients else gradient_bytes(params)
    if layout.strategy == "deepspeed" and layout.master_weights and not (spec.eight_bit or spec.factored):
        # DeepSpeed's optimizer steps the fp32 master weights: its states are fp32 too (bf16 weights and gradients
        # + fp32 master + two fp32 Adam moments = 16 B/param, as DeepSpeed counts mixed-precision Adam)
        spec = replace(spec, state_bytes=4)
    opt = optimizer_state_bytes(params, spec)
    scratch = optimizer_step_temporary(params, spec, layout.device)
    galore = layout.optimizer.startswith("galore_adamw") and layout.low_rank is not None
    if galore:
        opt = galore_state_bytes(params, *layout.low_rank, eight_bit="8bit" in layout.optimizer)
        spec = replace(spec, label=f"{layout.optimizer}: rank-{layout.low_rank[0]} projected moments")
        if layout.optimizer.endswith("_layerwise"):  # each parameter is updated in its own backward hook
            grads = max((p.numel * p.itemsize for p in params if p.trainable), default=0)
            scratch = 0
    master = sum(p.numel * 4 for p in params if p.trainable) if layout.master_weights else 0
    offloaded = 0
    w_factor, g_factor, o_factor = 1.0, 1.0, 1.0
    extra: list[MemoryItem] = []

    if layout.strategy == "fsdp" and layout.fsdp_sharding != "no_shard":
        w_factor, g_factor, o_factor = 1 / n, 1 / n, 1 / n
        # the root stays gathered; of the others, the unit computing and the one prefetched
        gathered = layout.root_unit_bytes + 2 * layout.largest_unit_bytes
        if layout.fsdp_sharding == "shard_grad_op":
            gathered = w_total  # parameters stay gathered between forward and backward
        extra.append(MemoryItem("weights", "all-gathered FSDP units", gathered))
        if layout.largest_unit_grad_bytes:
            extra.append(MemoryItem("gradients", "unsharded gradients of one unit", layout.largest_unit_grad_bytes,
                                    "backward"))
        if layout.fsdp_offload:
            offloaded = int((w_total + grads + opt) / n)
            w_factor = g_factor = o_factor = 0.0
    elif layout.strategy == "deepspeed":
        o_factor = 1 / n
        g_factor = 1 / n if layout.zero_stage >= 2 else 1.0
        if layout.zero_stage == 3:
            w_factor = 1 / n
            extra.append(MemoryItem("weights", "gathered ZeRO-3 parameters", 2 * layout.largest_unit_bytes))
        master = int(master / n)
        if layout.offload_optimizer:
            offloaded += int(opt / n) + master
            o_factor, master = 0.0, 0
        if layout.offload_params and layout.zero_stage == 3:
            offloaded += int(w_total / n)
            w_factor = 0.0
    elif layout.strategy == "ddp" and n > 1:
        extra.append(MemoryItem("gradients", "DDP gradient buckets", grads))

    items = [MemoryItem("weights", k, int(v * w_factor)) for k, v in by_dtype.items()]
    if layout.reference_copy:  # TRL loads it like the model and prepares it with the same sharding
        items.append(MemoryItem("weights", f"{layout.reference_copy} reference (frozen copy)", int(w_total * w_factor)))
        if w_factor == 0.0:
            offloaded += int(w_total / n)
    items.append(MemoryItem("gradients", _dtypes(params), int(grads * g_factor), "update"))
    items.append(MemoryItem("optimizer", spec.label, int(opt * o_factor)))
    if master:
        items.append(MemoryItem("optimizer", "fp32 master weights", master))
    detail = "checkpointed: layer inputs + head" if layout.checkpointing else "saved for backward"
    saved = profile.saved(layout.checkpointing)
    recompute = layout.checkpointing
    offloaded_activations = 0
    if layout.offload_activations:  # on the device: the layer in flight (in forward, or brought back for backward)
        offloaded_activations = saved
        offloaded += saved
        saved, detail = max(profile.layer_bytes, default=0), "offloaded to host; one layer on the device"
        # with checkpointing too, the layer in flight is the one recomputed from its brought-back input: the same
        # one layer on the device (counting it again as recompute doubled long-context plans); the host holds less
        recompute = False
    items.append(MemoryItem("activations", detail, saved, "backward"))
    transient, what = profile.transient(recompute)
    items.append(MemoryItem("temporary", what, transient, "backward"))
    if profile.tile_bytes:  # counted beside the layer's recompute or the head's gradients (at most one is in flight)
        items.append(MemoryItem("temporary", TILE_SLICE, profile.tile_bytes, "backward"))
    items.append(MemoryItem("temporary", "optimizer update scratch", int(scratch * o_factor), "update"))
    items += extra
    if layout.device == "cuda":
        items.append(MemoryItem("temporary", "cuBLAS workspaces (forward and backward threads)",
                                CUBLAS_HANDLES * cublas_workspace()))
    phase_bytes = {ph: sum(i.bytes for i in items if i.phase == ph) for ph in ("always", "backward", "update")}
    peak = "backward" if phase_bytes["backward"] >= phase_bytes["update"] else "update"
    total = phase_bytes["always"] + phase_bytes[peak]
    return DeviceMemory(tuple(i for i in items if i.bytes or i.kind != "temporary"), peak, total, offloaded,
                        offloaded_activations)


def cublas_workspace(config: str | None = None) -> int:
    """Bytes of one cuBLAS handle's workspace: CUBLAS_WORKSPACE_CONFIG's ":SIZE_KiB:COUNT" pairs summed, else
    torch's Hopper default."""
    import os

    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG") if config is None else config
    pairs = re.findall(r":(\d+):(\d+)", config or "")
    return sum(int(k) * 1024 * int(n) for k, n in pairs) if pairs else CUBLAS_DEFAULT_WORKSPACE


def _dtypes(params: list[ParamFact]) -> str:
    return "/".join(sorted({p.dtype for p in params if p.trainable})) or "-"


def layer_split(facts: list[ParamFact], double_quant: bool = False) -> tuple[int, int]:
    """(bytes of the largest numbered layer, bytes outside numbered layers): what a per-layer sharding
    (FSDP units, ZeRO-3 gathers) holds gathered at once, without the model at hand."""
    layers: dict[str, int] = {}
    for f in facts:
        m = re.search(r"\.(\d+)\.", f.name)
        key = m.group(1) if m else "root"
        layers[key] = layers.get(key, 0) + weight_bytes(f, double_quant)
    root = layers.pop("root", 0)
    return max(layers.values(), default=0), root
