"""A whole training step's activation peak, measured on the meta device: `ftune plan`'s check on its own sum.

`ftune.estimate.probe` measures what autograd saves in forward; the memory model adds one recomputed layer (with
checkpointing) or the head's gradients in backward. What that sum leaves out is what backward holds in flight inside
a layer: the gradients of its intermediates while they flow (an MLP's backward holds several of its widest tensors at
once). On a long row they are a fifth of the step (16,384 tokens, CPU: the sum was 0.77 of the step's peak).

Here one forward and backward of the meta model run as the recipe trains (checkpointing as it says, the tiled MLP
as it says) under a dispatch mode that counts every storage an operation creates and, through a weak reference to
the storage, every one freed: the peak of what is alive, minus the parameters' gradients (the memory model's
`gradients`). Nothing is computed or allocated. On CPU the same counting of a real step equals the process's peak
RSS within 2%, and the meta count equals the real one (tests/unit/test_step_probe.py).
"""

from __future__ import annotations

import contextlib
import weakref


def _counter():
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Live(TorchDispatchMode):
        """Bytes of storages created under the mode and still alive; their peak."""

        def __init__(self, exclude: set[int]):
            super().__init__()
            self.exclude = exclude  # weights and buffers: a view of one (a transpose) is not a new storage
            self.now = self.peak = 0
            self.start: int | None = None  # what was alive when backward reached the decoder layers
            self.layers_peak = 0
            self.refs: dict[int, weakref.ref] = {}
            self.sizes: dict[int, int] = {}

        def forget(self, storage) -> None:
            """Stop counting a storage (a parameter's gradient, counted elsewhere)."""
            key = storage._cdata
            if self.refs.pop(key, None) is not None:
                self.now -= self.sizes.pop(key)

        def _freed(self, key):
            def callback(_ref):
                if self.refs.pop(key, None) is not None:
                    self.now -= self.sizes.pop(key)

            return callback

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            import torch

            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    storage = t.untyped_storage()
                    key = storage._cdata
                    if key not in self.refs and key not in self.exclude:
                        self.sizes[key] = storage.nbytes()
                        self.now += self.sizes[key]
                        self.refs[key] = weakref.ref(storage, self._freed(key))
            self.peak = max(self.peak, self.now)
            if self.start is not None:
                self.layers_peak = max(self.layers_peak, self.now)
            return out

        def layers_begin(self, grad) -> None:
            """Backward has finished the head and reached the last decoder layer's output."""
            if self.start is None:
                self.start = self.layers_peak = self.now

    return Live


@contextlib.contextmanager
def _no_packed_check():
    """transformers looks for packed rows in the position ids with a data-dependent `.all()` (which the meta device
    can't answer) whenever checkpointing turns the cache off; the probe's rows are not packed."""
    from transformers import masking_utils

    found = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = found


LAYERS_STEPPED = 2
"""Decoder layers the meta step keeps: the layers of a decoder are alike, so what one holds in flight in backward is
measured on the last two (the step's cost, ~1 s of Python dispatch for 32 layers, would double a 7B plan's); all of
them when none of those two trains (`freeze` of the bottom layers)."""


def step_peak(model, *, batch: int, seq: int, attn_implementation: str, checkpointing: bool, tile_rule=None,
              task: str = "causal-lm", layers: int | None = LAYERS_STEPPED) -> tuple[int, int, int]:
    """One forward + backward of the meta `model` (attention as the activation probe runs it: `eager`'s scores, else
    the flash/SDPA emulation) with only its last `layers` decoder layers (None: all), its trainable parameters'
    gradients left out: (the step's peak bytes alive, the peak while backward runs through the decoder layers,
    after the head, and how many layers ran). Checkpointing, the tiled MLP and the dropped layers are put back
    after."""
    import torch

    from ftune.estimate.probe import FLASH_NAME, _register_flash_emulation
    from ftune import tiled_mlp
    from ftune.plan.tiling import decoder_list

    if attn_implementation != "eager":
        _register_flash_emulation()
    config = model.config
    previous, cache = config._attn_implementation, getattr(config, "use_cache", None)
    config._attn_implementation = "eager" if attn_implementation == "eager" else FLASH_NAME
    config.use_cache = False  # as checkpointing sets it in training (transformers says so on every call otherwise)

    exclude = {t.untyped_storage()._cdata for t in (*model.parameters(), *model.buffers())}
    live = _counter()(exclude)
    params = [p for p in model.parameters() if p.requires_grad]
    hooks = [p.register_post_accumulate_grad_hook(lambda p: live.forget(p.grad.untyped_storage())) for p in params]
    found = decoder_list(model)
    every = dict(found._modules) if found is not None else {}
    stepped = list(every.values())[-layers:] if layers else list(every.values())  # the top: where adapters sit

    def mark(module, args, out) -> None:  # the last layer's output gets its gradient once the head's backward is done
        hidden = out[0] if isinstance(out, tuple) else out
        if hidden.requires_grad:
            hidden.register_hook(live.layers_begin)

    truncated = len(stepped) < len(every)
    if stepped:
        hooks.append(stepped[-1].register_forward_hook(mark))
    tiled = [layer.mlp for layer in stepped] if tile_rule is not None else []
    untiled = [m.__dict__.get("forward") for m in tiled]
    was_training = model.training
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        if found is not None:  # the model runs the layers in its list (transformers slices it by the config's depth)
            found._modules.clear()
            found._modules.update({str(i): layer for i, layer in enumerate(stepped)})
        if checkpointing:  # as the Trainer does: non-reentrant, the embeddings' output made to require grad
            base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False,
                                                                                  "preserve_rng_state": False})
        if checkpointing or truncated:  # without the layers below, the kept ones still get an input that trains
            base.enable_input_require_grads()
        tiled_mlp.apply(tiled, tile_rule)
        model.train()
        ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
        labels = torch.zeros(batch, dtype=torch.long, device="meta") if task == "sequence-classification" else ids
        with _no_packed_check(), live:
            model(input_ids=ids, labels=labels).loss.backward()
    finally:
        if found is not None:
            found._modules.clear()
            found._modules.update(every)
        for h in hooks:
            h.remove()
        for p in params:
            p.grad = None
        for m, forward in zip(tiled, untiled):
            m.__dict__.pop(tiled_mlp.MARK, None)
            if forward is None:
                m.__dict__.pop("forward", None)
            else:
                m.forward = forward
        if checkpointing:
            base.activation_checkpointing_disable()
        if checkpointing or truncated:
            base.disable_input_require_grads()
        model.train(was_training)
        config._attn_implementation, config.use_cache = previous, cache
    return live.peak, live.layers_peak, len(stepped)


def in_flight(model, profile, checkpointing: bool, *, tile_rule, batch: int, seq: int, attn_implementation: str,
              task: str, notes: list[str]) -> int:
    """What a meta step's peak in the decoder layers' backward holds beyond the memory model's sum for it (saved
    activations, the layer recomputed, a tiled MLP's slice; `profile` tiled by `tile_rule` already): backward's
    gradients in flight. 0, said in `notes`, when the step can't run on the meta device; 0 without checkpointing,
    where everything forward saved is still there and what one layer's backward adds is a small part of it."""
    if not checkpointing:
        return 0

    def step(layers):
        return step_peak(model, batch=batch, seq=seq, attn_implementation=attn_implementation, checkpointing=True,
                         tile_rule=tile_rule, task=task, layers=layers)

    try:
        try:
            _, layers_peak, n = step(LAYERS_STEPPED)
        except RuntimeError as e:  # nothing trains in the top layers: no graph to step back through
            if "does not require grad" not in str(e):
                raise
            _, layers_peak, n = step(None)
    except Exception as e:  # noqa: BLE001 - custom code or data-dependent ops: the sum stands alone, said
        notes.append(f"backward's gradients in flight not measured (a meta step failed: {type(e).__name__}); "
                     "the activations row counts what forward saves and one recomputed layer")
        return 0
    # the sum for the layers' backward (`ActivationProfile.transient`'s layer side) over the `n` layers the step ran:
    # their checkpointed inputs and what forward saved outside them but the head's log-probs (freed by then), one
    # layer recomputed, the tiled MLP's slice; the step holds the rest in flight on top
    saved = sum(profile.layer_input_bytes[-n:]) + profile.outside_bytes - profile.head_bytes
    counted = saved + max(profile.layer_bytes[-n:], default=0) + profile.tile_bytes
    return max(0, layers_peak - counted)
