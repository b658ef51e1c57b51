"""Weight memory of a quantized model: measured on a loaded model, predicted on the meta device by bitsandbytes'
layout. `ftune plan` predicts; the worker's run header measures, with the same `describe`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ftune.plan.quantization import quantized_linears, upcasts

if TYPE_CHECKING:
    from ftune.recipe.schema import Recipe


def weight_bytes(model) -> dict[str, int]:
    """Bytes the base weights hold: quantized (data + quantization constants), other, and the logical params.

    Adapter parameters injected by peft are left out: this is the frozen base, as loaded and prepared."""
    quantized = other = params = layers = 0
    adapters = _adapter_param_ids(model)
    for p in {id(p): p for p in model.parameters()}.values():
        if id(p) in adapters:
            continue
        kind = type(p).__name__
        nbytes = _nbytes(p)
        if kind == "Params4bit" and p.quant_state is not None:
            qs = p.quant_state
            nbytes += _nbytes(qs.absmax) + _nbytes(qs.code)
            if qs.nested and qs.state2 is not None:
                nbytes += _nbytes(qs.state2.absmax) + _nbytes(qs.state2.code) + 4  # + the fp32 offset
            params += math.prod(int(d) for d in qs.shape)
        elif kind == "Int8Params":
            nbytes += _nbytes(getattr(p, "SCB", None))
            params += p.numel()
        else:
            params += p.numel()
            other += nbytes
            continue
        quantized += nbytes
        layers += 1
    return {"quantized": quantized, "other": other, "params": params, "layers": layers}


def _adapter_param_ids(model) -> set[int]:
    """Parameters peft injected (lora_A/B, ...): not part of the base's weight memory."""
    ids: set[int] = set()
    for module in model.modules():
        for attr in getattr(module, "adapter_layer_names", ()):
            sub = getattr(module, attr, None)
            if sub is not None and hasattr(sub, "parameters"):
                ids |= {id(p) for p in sub.parameters()}
    return ids


def estimate_bytes(recipe: Recipe, model) -> dict[str, int]:
    """`weight_bytes` predicted on the meta model, by bitsandbytes' layout (blocks of 64, 16/256-entry codes).

    Unquantized weights count as fp32 where k-bit preparation upcasts them (`upcasts`), else in the model dtype.
    """
    q = recipe.kbit
    names = set(quantized_linears(recipe, model))
    upcast = upcasts(recipe)
    loaded = {"float32": 4, "bfloat16": 2, "float16": 2}.get(recipe.model.dtype)

    def itemsize(p) -> int:
        return 4 if upcast else (loaded or p.element_size())

    quantized = other = params = 0
    for name, module in model.named_modules():
        if name in names:
            n = module.in_features * module.out_features
            if q.bits == 8:
                quantized += n + 4 * module.out_features  # int8 data + fp32 row scales (SCB)
            else:
                blocks = -(-n // 64)
                absmax = blocks + 4 * -(-blocks // 256) + 1024 + 4 if q.double_quant else 4 * blocks
                quantized += (n + 1) // 2 + absmax + 64
            params += n
            if getattr(module, "bias", None) is not None:
                other += module.bias.numel() * itemsize(module.bias)
                params += module.bias.numel()
            continue
        for p in module.parameters(recurse=False):
            params += p.numel()
            other += p.numel() * itemsize(p)
    return {"quantized": quantized, "other": other, "params": params, "layers": len(names)}


def _nbytes(t) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def describe(recipe: Recipe, model) -> dict:
    """Weight memory of the quantized model against the same model in bf16, for the plan and the summary.

    Measured on a loaded model; predicted (`estimated: true`) on a meta-device model, as `ftune plan` has.
    """
    q = recipe.kbit
    on_meta = any(p.device.type == "meta" for p in model.parameters())
    b = estimate_bytes(recipe, model) if on_meta and q is not None else weight_bytes(model)
    total = b["quantized"] + b["other"]
    bf16 = 2 * b["params"]
    return {
        "bits": q.bits if q else None,
        "type": (q.type if q.bits == 4 else "int8") if q else None,
        "estimated": on_meta,
        "quantized_layers": b["layers"],
        "quantized_weight_bytes": b["quantized"],
        "other_weight_bytes": b["other"],
        "weight_bytes": total,
        "bf16_weight_bytes": bf16,
        "ratio_vs_bf16": round(total / bf16, 4) if bf16 else None,
    }


def describe_line(info: dict) -> str:
    """`describe` in one line for the plan and the summary: '4-bit nf4: 4187.26 MiB weights vs 12852.51 MiB in bf16
    (0.33x)' (Llama-2-7B, double quant)."""
    mib = 1024 * 1024
    return (f"{info['bits']}-bit {info['type']}: {info['weight_bytes'] / mib:.2f} MiB weights vs "
            f"{info['bf16_weight_bytes'] / mib:.2f} MiB in bf16 ({info['ratio_vs_bf16']:.2f}x)")
