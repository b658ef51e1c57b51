"""What `ftune plan` says about a mixture-of-experts model: active parameters and FLOPs per token, what the
recipe trains by model part, and a loud note when no expert trains (the counting itself is ftune.models.moe's)."""

from __future__ import annotations

from dataclasses import dataclass

from ftune.models.moe import MoeLayout, group_of, moe_layout


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
        fix = recipe.peft.experts_hint
        notes.append(f"MoE: no expert trains, only {trained}: the {counts.num_experts} experts x "
                     f"{counts.layers} layers hold {share:.0f}% of the parameters; {fix}")
    return MoeFacts(num_experts=counts.num_experts, top_k=counts.top_k, moe_layers=counts.layers,
                    params_model=counts.total, params_active=counts.active, params_experts=counts.experts,
                    flops_per_token=6 * (counts.active - embedding), trainable_by_part=parts)



def mlp_values(model, layout: MoeLayout, hidden: int) -> float:
    """Values an MoE layer keeps for backward per token, for the activation formula (ftune.estimate.probe): each of
    the top_k experts a token is routed to keeps the gathered input and its output (2 x hidden) and its SwiGLU
    intermediates (gate and up, the activation, their product: 4 x its width, the width being its parameters / 3 x
    hidden); the router keeps its input and logits; shared experts keep what a dense SwiGLU MLP does. The mean
    over the MoE layers, applied to every layer."""
    modules = dict(model.named_modules())
    k = layout.top_k or layout.num_experts
    total = 0.0
    for block in layout.blocks:
        per_expert = sum(_numel(s) for s in block.tensors.values() if len(s) == 3) / layout.num_experts
        routed = k * (2 * hidden + 4 * per_expert / (3 * hidden))
        shared = sum(modules[n].weight.numel() for n in block.shared if n in modules) / (3 * hidden)
        total += routed + hidden + 2 * layout.num_experts + (hidden + 4 * shared if shared else 0)
    return total / len(layout.blocks)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
