"""What autograd keeps for backward, measured on the meta device: the activation side of `ftune plan`.

One forward pass of the meta model runs under autograd's saved-tensor hooks, which see every tensor
autograd keeps for backward, with its shape and dtype; nothing is computed or allocated. This is the
activation memory of this exact architecture, method and attention path, with no formula per model
family. Tests check it equals what a real CPU forward saves, byte for byte, on tiny models.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ftune.estimate.memory import ActivationProfile


@dataclass
class _Recorder:
    """State shared by the saved-tensor and module hooks during the probe."""

    exclude: set[int]
    layer: int | None = None
    seen: dict[int, int] = field(default_factory=dict)
    owner: dict[int, int | None] = field(default_factory=dict)
    largest_outside: int = 0
    alive: list = field(default_factory=list)
    """Every recorded tensor, held until the probe ends: a freed storage's address could otherwise be
    reused by a later tensor, which would then look already seen (meta tensors cost no memory)."""

    def record(self, t) -> None:
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self.exclude or key in self.seen:
            return
        self.alive.append(t)
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

    `quantized` holds the ids of weights whose matmul keeps its input for backward even when frozen
    (bitsandbytes' 8-bit matmul does; its 4-bit one and a frozen `nn.Linear` keep only the weight), so
    the probe records those inputs.
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


def formula_profile(config, *, batch: int, seq: int, itemsize: int, eager: bool) -> ActivationProfile:
    """The textbook estimate, for models whose forward cannot run on the meta device (data-dependent
    routing, custom code): 34 bytes x tokens x hidden per layer at 16 bits (Korthikanti et al. 2022),
    plus the seq x seq scores (5 x heads x seq bytes per token) with eager attention."""
    h = getattr(config, "hidden_size", 0) or 0
    layers = getattr(config, "num_hidden_layers", 0) or 0
    heads = getattr(config, "num_attention_heads", 1) or 1
    vocab = getattr(config, "vocab_size", 0) or 0
    tokens = batch * seq
    per_token = 17 * h * itemsize + (5 * heads * seq * itemsize // 2 if eager else 0)
    head = tokens * vocab * 4
    return ActivationProfile((tokens * per_token,) * layers, (tokens * h * itemsize,) * layers, head, head)
