"""Byte accounting for `ftune plan`: weights, gradients, optimizer states, activations, sharding.

The accounting functions are pure (they take parameter facts and an activation profile), so they are
unit-tested without torch. `probe_activations` is the one heavy function: it runs a forward pass of
the meta-device model and records, through autograd's saved-tensor hooks, every tensor autograd keeps
for backward. That is the activation memory of this exact architecture and method, with no formula
per model family. Nothing is computed on the meta device, so the probe reads and allocates no data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

GiB = 1024**3

# 4-bit (bitsandbytes Params4bit): 2 values per byte, one fp32 absmax per block of 64 values; with double
# quantization the absmax are 8-bit, with one fp32 absmax per 256 of them and a 256-entry fp32 code.
NF4_BLOCK = 64
NESTED_BLOCK = 256
# bitsandbytes 8-bit optimizers: blockwise (256) quantized states, fp32 states below 4096 elements.
BNB_OPT_BLOCK = 256
BNB_MIN_8BIT_SIZE = 4096


@dataclass(frozen=True)
class ParamFact:
    """One parameter tensor as the estimate sees it."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without the prefix, e.g. "bfloat16"
    itemsize: int
    trainable: bool
    quant: str | None = None  # "nf4", "fp4", "int8" for a bitsandbytes-quantized weight

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class ActivationProfile:
    """What autograd keeps for backward in one forward of `batch` x `seq` tokens, in bytes."""

    layer_bytes: tuple[int, ...]
    """Saved inside each decoder layer."""
    layer_input_bytes: tuple[int, ...]
    """Each layer's hidden-state input when the layer is in the backward graph (what checkpointing keeps)."""
    outside_bytes: int
    """Saved outside the layers: embeddings, final norm, head, loss."""
    head_bytes: int
    """The largest tensor saved by the head/loss (fp32 log-probabilities): backward starts by allocating
    two gradients of that size, on top of everything saved."""

    def saved(self, checkpointing: bool) -> int:
        """Bytes kept from forward to backward; with checkpointing only each layer's input and the head's."""
        if not checkpointing:
            return sum(self.layer_bytes) + self.outside_bytes
        return sum(self.layer_input_bytes) + self.outside_bytes

    def transient(self, checkpointing: bool) -> tuple[int, str]:
        """Backward's own peak on top of `saved`: the two logits-sized gradients it starts with, or, with
        checkpointing, one layer recomputed once the head's log-probs are freed, whichever is larger."""
        head = 2 * self.head_bytes
        recompute = max(self.layer_bytes, default=0) - self.head_bytes if checkpointing else 0
        if recompute > head:
            return recompute, "one layer recomputed in backward"
        return head, "head gradients (logits-sized)"


@dataclass(frozen=True)
class MemoryItem:
    """One line of the memory table: per device, after sharding and offload."""

    kind: str  # weights | gradients | optimizer | activations | temporary
    detail: str
    bytes: int
    phase: str = "always"  # always | backward | update: what is alive when


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


# ------------------------------------------------------------------------------------------ activations
@dataclass
class _Recorder:
    """State shared by the saved-tensor and module hooks during the probe."""

    exclude: set[int]
    layer: int | None = None
    seen: dict[int, int] = field(default_factory=dict)
    owner: dict[int, int | None] = field(default_factory=dict)
    largest_outside: int = 0

    def record(self, t) -> None:
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self.exclude or key in self.seen:
            return
        nbytes = storage.nbytes()
        self.seen[key] = nbytes
        self.owner[key] = self.layer
        if self.layer is None:
            self.largest_outside = max(self.largest_outside, nbytes)


FLASH_NAME = "ftune_meta_flash"


def _register_flash_emulation() -> None:
    """An attention implementation for the probe that keeps what flash/SDPA kernels keep: q, k, v, the
    output, the fp32 log-sum-exp and a mask when there is one (no seq x seq scores), taking the masks and
    key/value layout transformers' SDPA path would. Registered under its own name, so real runs in the
    same process are untouched."""
    import torch
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import repeat_kv, use_gqa_in_sdpa
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    if FLASH_NAME in AttentionInterface._global_mapping:
        return

    class _Flash(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, mask):
            b, h, s, d = q.shape
            out = q.new_empty(b, s, h, v.shape[-1]).transpose(1, 2)  # kernels write (batch, seq, heads, dim)
            lse = q.new_empty(b, h, s, dtype=torch.float32)
            saved = (q, k, v, out, lse)
            if mask is not None:  # a boolean mask is converted to an additive one per call, and kept
                saved += (q.new_empty(mask.shape[0], 1, s, k.shape[-2]),)
            ctx.save_for_backward(*saved)
            return out

        @staticmethod
        def backward(ctx, grad):  # pragma: no cover - the probe never runs backward
            raise NotImplementedError

    def flash(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        groups = getattr(module, "num_key_value_groups", 1)
        if groups > 1 and not use_gqa_in_sdpa(attention_mask, key, value):  # as transformers' sdpa does
            key, value = repeat_kv(key, groups), repeat_kv(value, groups)
        out = _Flash.apply(query, key, value, attention_mask)
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register(FLASH_NAME, flash)
    ALL_MASK_ATTENTION_FUNCTIONS.register(FLASH_NAME, sdpa_mask)


def probe_activations(
    model,
    *,
    batch: int,
    seq: int,
    attn_implementation: str,
    layer_classes: set[str],
    quantized: set[int],
    task: str = "causal-lm",
) -> ActivationProfile:
    """Run one forward of the meta model and measure what autograd saves, per decoder layer.

    `quantized` holds the ids of weights bitsandbytes would quantize: their matmul keeps its input for
    backward even when frozen (a plain frozen Linear keeps only its weight), so the probe records it.
    """
    import torch

    if attn_implementation != "eager":
        _register_flash_emulation()
    config = model.config
    previous = config._attn_implementation
    config._attn_implementation = "eager" if attn_implementation == "eager" else FLASH_NAME

    exclude = {p.untyped_storage()._cdata for p in model.parameters()}
    exclude |= {b.untyped_storage()._cdata for b in model.buffers()}
    rec = _Recorder(exclude=exclude)
    layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
    inputs: list[int] = [0] * len(layers)
    handles = []

    def enter(i):
        def hook(module, args, kwargs):
            rec.layer = i
            hidden = args[0] if args else kwargs.get("hidden_states")
            trains = any(p.requires_grad for p in module.parameters())
            if hidden is not None and (hidden.requires_grad or trains):
                inputs[i] = hidden.numel() * hidden.element_size()

        return hook

    def leave(module, args, output):
        rec.layer = None

    def quantized_input(module, args, output):
        if args and args[0].requires_grad:
            rec.record(args[0])

    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(enter(i), with_kwargs=True))
        handles.append(layer.register_forward_hook(leave))
    for m in model.modules():
        w = getattr(m, "weight", None)
        if w is not None and id(w) in quantized:
            handles.append(m.register_forward_hook(quantized_input))

    def pack(t):
        rec.record(t)
        return t

    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    labels = torch.zeros(batch, dtype=torch.long, device="meta") if task == "sequence-classification" else ids
    was_training = model.training
    model.train()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(input_ids=ids, labels=labels)
    finally:
        for h in handles:
            h.remove()
        config._attn_implementation = previous
        model.train(was_training)

    per_layer = [0] * len(layers)
    outside = 0
    for key, nbytes in rec.seen.items():
        owner = rec.owner[key]
        if owner is None:
            outside += nbytes
        else:
            per_layer[owner] += nbytes
    return ActivationProfile(tuple(per_layer), tuple(inputs), outside, rec.largest_outside)


# ------------------------------------------------------------------------------------------- per device
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


@dataclass(frozen=True)
class DeviceMemory:
    items: tuple[MemoryItem, ...]
    peak_phase: str
    """`backward` (activations, head gradient) or `update` (gradients, update scratch): whichever is larger."""
    total: int
    """Peak bytes: the `always` items plus those of the peak phase."""
    offloaded: int
    """Bytes moved to host memory by offload options."""

    def at_peak(self, item: MemoryItem) -> bool:
        return item.phase in ("always", self.peak_phase)


def per_device(params: list[ParamFact], profile: ActivationProfile, layout: Layout) -> DeviceMemory:
    """Peak bytes on one device: weights + optimizer states, plus the larger of the backward phase
    (activations and the head's gradient) and the update phase (gradients and the update's scratch)."""
    spec, _ = optimizer_spec(layout.optimizer)
    n = max(layout.shard_ranks, 1)
    by_dtype = weights_by_dtype(params, layout.double_quant)
    w_total = sum(by_dtype.values())
    grads = 0 if spec.no_gradients else gradient_bytes(params)
    opt = optimizer_state_bytes(params, spec)
    scratch = optimizer_step_temporary(params, spec, layout.device)
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
    items.append(MemoryItem("gradients", _dtypes(params), int(grads * g_factor), "update"))
    items.append(MemoryItem("optimizer", spec.label, int(opt * o_factor)))
    if master:
        items.append(MemoryItem("optimizer", "fp32 master weights", master))
    detail = "checkpointed: layer inputs + head" if layout.checkpointing else "saved for backward"
    items.append(MemoryItem("activations", detail, profile.saved(layout.checkpointing), "backward"))
    transient, what = profile.transient(layout.checkpointing)
    items.append(MemoryItem("temporary", what, transient, "backward"))
    items.append(MemoryItem("temporary", "optimizer update scratch", int(scratch * o_factor), "update"))
    items += extra
    phase_bytes = {ph: sum(i.bytes for i in items if i.phase == ph) for ph in ("always", "backward", "update")}
    peak = "backward" if phase_bytes["backward"] >= phase_bytes["update"] else "update"
    total = phase_bytes["always"] + phase_bytes[peak]
    return DeviceMemory(tuple(i for i in items if i.bytes or i.kind != "temporary"), peak, total, offloaded)


def _dtypes(params: list[ParamFact]) -> str:
    return "/".join(sorted({p.dtype for p in params if p.trainable})) or "-"
