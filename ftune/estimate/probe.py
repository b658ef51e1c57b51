"""What autograd keeps for backward, measured on the meta device: the activation side of `ftune plan`.

One forward pass of the meta model runs under autograd's saved-tensor hooks, which see every tensor
autograd keeps for backward, with its shape and dtype; nothing is computed or allocated. This is the
activation memory of this exact architecture, method and attention path, with no formula per model
family. Tests check it equals what a real CPU forward saves, byte for byte, on tiny models.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ftune.estimate.facts import ActivationProfile


@dataclass
class _Recorder:
    """State shared by the saved-tensor and module hooks during the probe."""

    exclude: set[int]
    layer: int | None = None
    mlp: int | None = None  # the layer whose MLP (`layer.mlp`) is running
    in_mlp: dict[int, int] = field(default_factory=dict)  # storage -> the layer whose MLP saved it first
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
        if self.mlp is not None:
            self.in_mlp[key] = self.mlp
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
        def backward(ctx, grad):  # the kernels' gradients of q, k and v, shaped as their inputs
            q, k, v = ctx.saved_tensors[:3]
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None

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

    kept: list[int] = [0] * len(layers)

    def mlp_enter(i):
        def hook(module, args):
            rec.mlp = i
            if args and (args[0].requires_grad or any(p.requires_grad for p in module.parameters())):
                # the tiled MLP saves its input; counted unless something outside the MLP saved it already
                storage = args[0].untyped_storage()
                kept[i] = 0 if storage._cdata in rec.seen else storage.nbytes()

        return hook

    def mlp_leave(module, args, output):
        rec.mlp = None

    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(enter(i), with_kwargs=True))
        handles.append(layer.register_forward_hook(leave))
        if isinstance(mlp := getattr(layer, "mlp", None), torch.nn.Module):
            handles.append(mlp.register_forward_pre_hook(mlp_enter(i)))
            handles.append(mlp.register_forward_hook(mlp_leave))
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
    mlp = [0] * len(layers)
    for key, i in rec.in_mlp.items():
        mlp[i] += rec.seen[key]
    return ActivationProfile(tuple(per_layer), tuple(inputs), outside, rec.largest_outside, tuple(mlp), tuple(kept))


HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model", "dim")
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads")
DENSE_MLP = 9.5
"""Values the formula's MLP keeps per token, in units of hidden: 19 bytes at 16 bits for a 4 x hidden MLP."""


def _config_int(config, keys: tuple[str, ...]) -> int:
    for key in keys:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return 0


def formula_profile(config, *, batch: int, seq: int, itemsize: int, eager: bool, model=None,
                    layer_classes: set[str] = frozenset(), mlp_values: float | None = None,
                    notes: list[str] | None = None) -> ActivationProfile:
    """The textbook estimate, for models whose forward cannot run on the meta device (data-dependent
    routing, custom code): 34 bytes x tokens x hidden per layer at 16 bits (Korthikanti et al. 2022): 15 for
    attention and norms, 19 for a 4 x hidden MLP, which `mlp_values` (values per token, an MoE's routed experts:
    ftune.estimate.moe.mlp_values) replaces; plus the seq x seq scores (5 x heads x seq bytes per token) with eager
    attention. A size the config lacks (another key, a nested text config) is read from `model`'s structure:
    the embedding width and the count of `layer_classes` modules; what is still unknown is said in `notes`."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    h = _config_int(text, HIDDEN_KEYS)
    layers = _config_int(text, LAYER_KEYS)
    heads = _config_int(text, HEAD_KEYS)
    vocab = _config_int(text, ("vocab_size",))
    said = notes if notes is not None else []
    if model is not None:
        embeddings = model.get_input_embeddings()
        if not h and embeddings is not None:
            h = embeddings.embedding_dim
            said.append(f"activation formula: hidden size {h} read from the input embeddings (not in the config)")
        if not layers and layer_classes:
            layers = sum(type(m).__name__ in layer_classes for m in model.modules())
            if layers:
                said.append(f"activation formula: {layers} layers counted in the model (not in the config)")
        if not vocab and embeddings is not None:
            vocab = embeddings.num_embeddings
    if not h or not layers:
        missing = " and ".join(k for k, v in (("hidden size", h), ("layer count", layers)) if not v)
        said.append(f"activations not counted: the config gives no {missing} and the model shows none")
        return ActivationProfile((0,) * layers, (0,) * layers, 0, 0)
    if eager and not heads:
        heads = 1
        said.append("activation formula: attention heads not in the config; the eager scores assume 1 head")
    tokens = batch * seq
    mlp = DENSE_MLP * h if mlp_values is None else mlp_values
    per_token = int((7.5 * h + mlp) * itemsize) + (5 * heads * seq * itemsize // 2 if eager else 0)
    head = tokens * vocab * 4
    return ActivationProfile((tokens * per_token,) * layers, (tokens * h * itemsize,) * layers, head, head)
