"""What quantization-aware training (`quantization.qat`) costs beside the same run without it, for `ftune plan`:
the memory the fake quantization adds, its compute per step, and the size of the model `ftune merge` writes.

Counted, not measured (torchao 0.18's FakeQuantizedLinear): each quantized linear's forward builds a fake-quantized
copy of its weight (kept by autograd for the backward), so one weight copy per layer in the model's dtype is alive
from forward to backward; int8 dynamic activations also keep a fake-quantized copy of each linear's input. The
fake quantization is elementwise (about 8 operations per weight or activation value: a group's absolute maximum,
scale, divide, round, clamp, multiply back; the backward passes the gradient straight through), next to
6 x parameters x tokens for the matmuls: a small share of the FLOPs, though memory-bound, so on a GPU it costs more
time than its FLOPs say.
"""

from __future__ import annotations

from ftune.estimate.units import fmt_bytes

OPS_PER_VALUE = 8
"""Elementwise operations the fake quantization of one value takes (forward), as counted above."""


def cost_lines(recipe, model, itemsize: int, batch: int, seq: int) -> list[str]:
    """`ftune plan`'s notes for a QAT recipe (none without one): memory, compute per step, exported size."""
    qat = recipe.qat
    if qat is None:
        return []
    from ftune.plan.qat import quantized_linears

    modules = dict(model.named_modules())
    linears = {n: modules[n] for n in quantized_linears(model)}
    weights = sum(m.weight.numel() for m in linears.values())
    params = sum(p.numel() for p in model.parameters())
    acts = qat.scheme != "int4-weight"
    accumulation = recipe.train.gradient_accumulation_steps
    inputs = sum(m.in_features for m in linears.values())
    memory = weights * itemsize + (batch * seq * inputs * itemsize if acts else 0)  # one micro-batch alive
    tokens_per_step = batch * seq * accumulation
    matmul = 6 * params * tokens_per_step
    extra = OPS_PER_VALUE * weights * accumulation
    if acts:
        extra += OPS_PER_VALUE * tokens_per_step * inputs
    if qat.scheme == "fp8":
        stored, what = weights * 1 + sum(m.out_features for m in linears.values()) * 4, "fp8 e4m3 + a scale per row"
    else:
        groups = weights // qat.group_size
        # torchao 0.18 stores int4 unpacked, one int8 per value, with a scale (model dtype) and zero point per group
        stored, what = weights + groups * (itemsize + 1), f"int4 stored as int8 + scale per group of {qat.group_size}"
    rest = (params - weights) * itemsize
    lines = [f"QAT {qat.scheme}: {len(linears)} linear layers ({weights:,} weights, output head excluded) train "
             f"fake-quantized" + (f" from step {qat.start_after_steps}" if qat.start_after_steps else ""),
             f"QAT memory: + {fmt_bytes(memory)} beside the same run without QAT (a fake-quantized copy of each "
             "weight" + (" and of each linear's input" if acts else "") + " kept for the backward; not in the table)",
             f"QAT compute: x{(matmul + extra) / matmul:.3f} of the baseline's FLOPs per step (elementwise, "
             "memory-bound: more in time on a GPU)" if matmul else "QAT compute: no tokens counted"]
    lines.append(f"QAT export (`ftune merge`): {fmt_bytes(stored + rest)} ({what}; other weights in the model's "
                 f"dtype) against {fmt_bytes(params * itemsize)} unquantized")
    return lines
