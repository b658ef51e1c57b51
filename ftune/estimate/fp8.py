"""`train.precision: fp8` beside bf16: what torchao's float8 training changes in a step's cost and memory, from the
layers `ftune.fp8` converts on the meta model.

Cost: the converted layers' matmuls run on FP8 tensor cores, whose peak is twice bf16's (Ada, Hopper, Blackwell);
the rest (the kept layers, attention's score and value products, everything outside matmuls) runs as in bf16. Per
token, a layer with P weights costs 6P FLOPs when its weights train (forward, input and weight gradients) and 4P when
they are frozen (LoRA, freeze: no weight gradient); causal attention 6 x layers x seq x hidden. The ratio is the
ideal one: torchao's scaling casts (fused by torch.compile) are not counted, so it bounds the gain from above.
Memory: the weights and optimizer states stay as in bf16 (torchao casts each converted weight to float8 per use);
the transient float8 copies of the largest converted layer (weight and its gradient's input) are added.
"""

from __future__ import annotations

from dataclasses import dataclass

FP8_SPEEDUP = 2.0
"""FP8 over bf16 dense tensor-core peak (H100: 1979 vs 989 TFLOPS; Ada and Blackwell: the same 2x)."""


@dataclass(frozen=True)
class Fp8Cost:
    converted_layers: int
    converted_params: int
    kept: dict[str, int]
    """Linear layers kept in bf16, counted by reason (output head, router, shape)."""
    matmul_share: float
    """The converted layers' share of a step's FLOPs (per token, at the recipe's sequence length)."""
    step_cost_vs_bf16: float
    """Estimated step time relative to bf16 (ideal: casts not counted)."""
    memory_bytes: int
    bf16_memory_bytes: int


def converted(model):
    """`ftune.fp8`'s choice on the model *before* the PEFT method is applied (the worker converts before it, and a
    method injecting in place would add its own linear layers), with the largest converted weight's size."""
    from ftune.fp8 import fp8_layers

    layers = fp8_layers(model)
    modules = dict(model.named_modules())
    return layers, max((modules[n].weight.numel() for n in layers.converted), default=0)


def fp8_cost(chosen, config, recipe, seq: int, bf16_total: int) -> Fp8Cost:
    layers, largest = chosen
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    trains = 6 if recipe.peft.trains_whole_model else 4
    attention = 6 * text.num_hidden_layers * seq * text.hidden_size
    total = trains * layers.linear_params + attention
    share = trains * layers.converted_params / total if total else 0.0
    kept: dict[str, int] = {}
    for why in layers.kept.values():
        kept[why] = kept.get(why, 0) + 1
    return Fp8Cost(len(layers.converted), layers.converted_params, kept, round(share, 4),
                   round(1 - share + share / FP8_SPEEDUP, 3), bf16_total + 2 * largest, bf16_total)


def describe(cost: Fp8Cost) -> str:
    from ftune.estimate.memory import fmt_bytes

    kept = ", ".join(f"{n} {why}" for why, n in sorted(cost.kept.items())) or "none"
    return (f"fp8: {cost.converted_layers} linear layers converted ({cost.converted_params:,} weights; kept bf16: "
            f"{kept}); their matmuls are {100 * cost.matmul_share:.0f}% of a step's FLOPs, so a step costs "
            f"~{cost.step_cost_vs_bf16:.2f}x bf16's at FP8's 2x tensor-core peak (casts not counted: an upper bound "
            f"on the gain); memory {fmt_bytes(cost.memory_bytes)} vs bf16's {fmt_bytes(cost.bf16_memory_bytes)}")
