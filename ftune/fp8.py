"""Which linear layers `train.precision: fp8` converts to torchao's float8 training (Float8Linear), decided on the
model itself (the meta model for `ftune plan`, the loaded one in the worker), so both sides agree.

Kept in bf16: the output head (its logits feed the loss and the softmax, where float8's 3-4 significant bits cost
accuracy for a small share of the FLOPs: torchao's and torchtitan's recipes leave it out), MoE routers and gates
(tiny, and a rounding error there reroutes tokens), and layers whose dimensions torchao's scaled matmul can't take
(both not multiples of 16). Everything else that is an `nn.Linear` is converted. Light: torch is imported lazily.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MULTIPLE = 16
"""torch._scaled_mm needs both matrix dimensions divisible by 16."""
GATE_NAMES = ("shared_expert_gate",)
"""Gates beside the routers (Qwen2-MoE's per-token shared-expert gate)."""


@dataclass(frozen=True)
class Fp8Layers:
    converted: list[str]
    """Full module names converted to float8."""
    kept: dict[str, str] = field(default_factory=dict)
    """Linear layers left in bf16, with the reason (`output head`, `router`, `shape`)."""
    converted_params: int = 0
    linear_params: int = 0


def fp8_layers(model) -> Fp8Layers:
    """The model's linear layers split into converted and kept (by reason)."""
    import torch

    from ftune.models.moe import moe_layout

    layout = moe_layout(model)
    routers = set(layout.router_modules) if layout else set()
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    converted, kept, conv_params, all_params = [], {}, 0, 0
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        all_params += module.weight.numel()
        leaf = name.rsplit(".", 1)[-1]
        if module is head or leaf == "lm_head":
            kept[name] = "output head"
        elif name in routers or leaf in GATE_NAMES:
            kept[name] = "router"
        elif module.in_features % MULTIPLE or module.out_features % MULTIPLE:
            kept[name] = "shape"
        else:
            converted.append(name)
            conv_params += module.weight.numel()
    return Fp8Layers(converted, kept, conv_params, all_params)


def module_filter(model):
    """torchao's `module_filter_fn(module, fqn) -> bool` for `convert_to_float8_training(model, ...)`: True for the
    layers `fp8_layers` converts."""
    chosen = set(fp8_layers(model).converted)
    return lambda module, fqn: fqn in chosen


def convert(model) -> Fp8Layers:
    """Swap the chosen layers for torchao's Float8Linear (dynamic tensorwise scaling), in place; before a PEFT
    method wraps them (a LoRA layer then runs its frozen base in float8). The worker's model stage, on CUDA only."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    layers = fp8_layers(model)
    chosen = set(layers.converted)
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("tensorwise"),
                               module_filter_fn=lambda module, fqn: fqn in chosen)
    return layers
