"""What the byte accounting reads and returns: a parameter's facts (shape, dtype, trainable, quantized), the
activation profile `ftune.estimate.probe` measures, and one row of a device's memory table. Plain data, no torch."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


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

    mlp_bytes: tuple[int, ...] = ()
    """Of `layer_bytes`, what each layer's MLP (`layer.mlp`) saves inside it: what the tiled MLP doesn't keep."""
    mlp_kept: tuple[int, ...] = ()
    """Each layer's MLP input, where nothing outside the MLP saves it: what the tiled MLP keeps instead."""
    inflight_bytes: int = 0
    """Backward's gradients in flight inside a layer, beyond the rest of the profile: a meta step's peak minus the
    sum (`ftune.estimate.step_probe`)."""
    tile_bytes: int = 0
    """With a tiled MLP: one slice's intermediates, recomputed in backward on top of `transient`'s (`tiled`)."""
    loss_tiled_in: int = 0
    """With a tiled loss: the slices its head and loss run in (`loss_tiled`); 0: the model's own loss."""

    def tiled(self, slices: int) -> ActivationProfile:
        """Each MLP tiled in `slices` (`train.tiled_mlp`): forward keeps its input only; backward recomputes one
        slice at a time. Unchanged where the probe did not measure the MLPs (a formula profile)."""
        if not self.mlp_bytes:
            return self
        mlp = self.mlp_bytes + (0,) * (len(self.layer_bytes) - len(self.mlp_bytes))  # vision layers: not tiled
        kept = self.mlp_kept + (0,) * (len(self.layer_bytes) - len(self.mlp_kept))
        layers = tuple(b - m + k for b, m, k in zip(self.layer_bytes, mlp, kept))
        return replace(self, layer_bytes=layers, mlp_bytes=(), mlp_kept=(),
                       tile_bytes=max(math.ceil(m / max(slices, 1)) for m in mlp))

    def loss_tiled(self, slices: int) -> ActivationProfile:
        """The head and loss in `slices` slices (`train.tiled_loss`): forward keeps none of the head's fp32
        log-probs; backward recomputes one slice's (its logits, then the log-probs) and starts with its two
        gradients: `head_bytes` becomes one slice's log-probs and half again, so the two gradients `transient` counts
        are the slice's three."""
        chunk = math.ceil(self.head_bytes / max(slices, 1))
        return replace(self, outside_bytes=max(self.outside_bytes - self.head_bytes, 0), head_bytes=chunk * 3 // 2,
                       loss_tiled_in=slices)

    def saved(self, checkpointing: bool) -> int:
        """Bytes kept from forward to backward; with checkpointing only each layer's input and the head's."""
        if not checkpointing:
            return sum(self.layer_bytes) + self.outside_bytes
        return sum(self.layer_input_bytes) + self.outside_bytes

    def transient(self, checkpointing: bool) -> tuple[int, str]:
        """Backward's own peak on top of `saved`: the two logits-sized gradients it starts with, or, once the head's
        log-probs are freed, the decoder layers' backward (one layer recomputed with checkpointing, and the
        gradients in flight a meta step measured), whichever is larger."""
        head = 2 * self.head_bytes
        freed = 0 if self.loss_tiled_in else self.head_bytes  # the head's saved log-probs (a tiled loss saves none)
        layer = (max(self.layer_bytes, default=0) if checkpointing else 0) + self.inflight_bytes
        if layer - freed > head:  # the layers' backward: the head's log-probs are freed by then
            what = "one layer recomputed in backward" if checkpointing else "backward through a layer"
            return layer - freed, what + (", its gradients in flight" if self.inflight_bytes else "")
        if self.loss_tiled_in:
            return head, "one slice of the tiled loss recomputed in backward (train.tiled_loss)"
        return head, "head gradients (logits-sized)"


@dataclass(frozen=True)
class MemoryItem:
    """One line of the memory table: per device, after sharding and offload."""

    kind: str  # weights | gradients | optimizer | activations | temporary
    detail: str
    bytes: int
    phase: str = "always"  # always | backward | update: what is alive when
