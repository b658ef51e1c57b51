"""What `ftune plan` says about a mixture-of-experts model: active parameters and FLOPs per token, what the
recipe trains by model part, and a loud note when no expert trains (the counting itself is ftune.moe's)."""

from __future__ import annotations

from dataclasses import dataclass

from ftune.moe import group_of, moe_layout


@dataclass(frozen=True)
class MoeFacts:
    num_experts: int
    top_k: int | None
    moe_layers: int
    params_model: int
    """The model's own parameters (the adapter's aside)."""
    params_active: int
    """Parameters one token goes through: all but the routed experts, plus top_k / num_experts of them."""
    params_experts: int
    """Parameters in the routed experts."""
    flops_per_token: int
    """Training FLOPs per token: 6 x the active parameters but the input embedding (a lookup), the usual MFU
    convention (attention scores aside)."""
    trainable_by_part: dict[str, int]
    """Trainable parameters by model part: attention, experts, router, shared experts, other."""


def moe_facts(model, recipe, counts, embedding: int, notes: list[str]) -> MoeFacts:
    """What an MoE recipe trains, by part, with a loud note when no expert trains."""
    layout = moe_layout(model)
    parts: dict[str, int] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            part = group_of(name, layout)
            parts[part] = parts.get(part, 0) + p.numel()
    if not parts.get("experts"):
        share = 100.0 * counts.experts / counts.total
        trained = " and ".join(k for k in parts) or "nothing"
        fix = {"lora": "set `peft.experts: true` (or target_modules: all-linear)",
               "freeze": "name them in peft.trainable (e.g. `mlp\\.experts\\.`)"}.get(recipe.peft.method,
                                                                                    "use peft.method lora or full")
        notes.append(f"MoE: no expert trains, only {trained}: the {counts.num_experts} experts x "
                     f"{counts.layers} layers hold {share:.0f}% of the parameters; {fix}")
    return MoeFacts(num_experts=counts.num_experts, top_k=counts.top_k, moe_layers=counts.layers,
                    params_model=counts.total, params_active=counts.active, params_experts=counts.experts,
                    flops_per_token=6 * (counts.active - embedding), trainable_by_part=parts)

