"""What the byte accounting reads and returns: a parameter's facts (shape, dtype, trainable, quantized), the
activation profile `ftune.estimate.probe` measures, and one row of a device's memory table. Plain data, no torch."""

from __future__ import annotations

import math
from dataclasses import dataclass


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
