"""The finiteness guard: no checkpoint marked complete and no final/ written from weights holding a NaN or an
infinity. bitsandbytes' packed weights are skipped: their integers are stored in a float dtype and can read as NaN.
"""

from __future__ import annotations

from pathlib import Path

from ftune.worker.names import clean

QUANTIZED_LAYERS = ("Linear4bit", "Linear8bitLt")
"""bitsandbytes layers: their `weight` holds packed integers stored in a float dtype (uint8 bytes reinterpreted as
bf16/fp32 under FSDP's `quant_storage`, which can read as NaN), never a float to check."""


def packed_weights(model) -> set[str]:
    """Clean names (no FSDP / checkpoint-wrapper segments) of bitsandbytes' packed weights in `model`: the
    finiteness checks skip them. bitsandbytes' classes only (peft's LoRA wrappers share the names), subclasses
    (FSDP2's `FSDPLinear4bit`) too."""
    return {clean(f"{name}.weight") for name, m in model.named_modules()
            if any(c.__name__ in QUANTIZED_LAYERS and c.__module__.startswith("bitsandbytes.")
                   for c in type(m).__mro__)}


def first_nonfinite_of(tensors, packed: set[str]) -> str | None:
    """Clean name of the first (name, tensor) pair holding a NaN or an infinity, packed weights skipped, or None.
    The one finiteness rule for a model's parameters and a gathered state dict alike."""
    import torch

    with torch.no_grad():
        for name, t in tensors:
            name = clean(name)
            if name in packed or not (t.numel() and t.is_floating_point()):
                continue
            if not bool(torch.isfinite(t).all()):
                return name
    return None


def first_nonfinite(model, *, trainable_only: bool) -> str | None:
    """Name of the first parameter holding a NaN or an infinity (this process's shard), or None."""
    return first_nonfinite_of(((n, p) for n, p in model.named_parameters() if p.requires_grad or not trainable_only),
                              packed_weights(model))


def nonfinite_saved(folder: Path) -> list[str]:
    """Names of saved tensors holding a NaN or an infinity (reads every tensor back)."""
    import torch
    from safetensors import safe_open

    bad = []
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                    bad.append(name)
    return bad
