"""A mixture-of-experts model's structure, read from the model itself (on the meta device or loaded), shared by
both sides: the LoRA targets (ftune.methods.lora), the preflight, the estimate (total and active parameters), the
worker's router statistics and the merge's per-expert check. Heavy libraries are imported inside the functions.

transformers 5 fuses each MoE layer's experts into a few `nn.Parameter` tensors of shape [experts, ...] held by a
module named `experts` (`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`; GPT-OSS adds per-expert biases). Its
sibling `gate` (or `router`) is the router; `shared_expert(s)` (Qwen2-MoE, DeepSeek) are plain linear layers every
token goes through. This holds for Qwen2/3-MoE, Mixtral, OLMoE, GPT-OSS and DeepSeek-V2/V3, and is found by
structure, not by a table of architectures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ROUTER_NAMES = ("gate", "router")
"""Names of the router module next to `experts`."""
SHARED_NAMES = ("shared_expert", "shared_experts", "shared_expert_gate")
"""Names of the shared-expert modules next to `experts` (their linear layers run for every token)."""
TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_top_k", "top_k")


@dataclass(frozen=True)
class MoeBlock:
    """One MoE layer: its experts module, router and shared experts, by full module name."""

    experts: str
    """The fused experts module, e.g. `model.layers.3.mlp.experts`."""
    tensors: dict[str, tuple[int, ...]]
    """Its parameters (full names) and shapes; all have the expert count first."""
    router: str | None
    """The router module (`...mlp.gate`), if found."""
    shared: list[str] = field(default_factory=list)
    """Linear layers of the shared experts (full module names)."""


@dataclass(frozen=True)
class MoeLayout:
    blocks: list[MoeBlock]
    num_experts: int
    top_k: int | None

    @property
    def expert_tensors(self) -> list[str]:
        """Full names of every expert tensor that LoRA can adapt (the 3-D ones; biases are 2-D)."""
        return [n for b in self.blocks for n, shape in b.tensors.items() if len(shape) == 3]

    @property
    def router_modules(self) -> list[str]:
        return [b.router for b in self.blocks if b.router]

    @property
    def shared_linears(self) -> list[str]:
        return [n for b in self.blocks for n in b.shared]


def _top_k(model, routers: list) -> int | None:
    for router in routers:
        k = getattr(router, "top_k", None)
        if isinstance(k, int) and k > 0:
            return k
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in TOP_K_KEYS:
        k = getattr(text, key, None)
        if isinstance(k, int) and k > 0:
            return k
    return None


def moe_layout(model) -> MoeLayout | None:
    """The model's MoE layers, or None for a dense model. Names are the base model's, also on a peft-wrapped
    model (peft's prefix and `base_layer` hops removed)."""
    modules = dict(model.named_modules())
    blocks: list[MoeBlock] = []
    routers = []
    experts_count = 0
    for name, module in modules.items():
        if name.rsplit(".", 1)[-1] != "experts" or ".base_layer" in name:
            continue
        tensors = {f"{base_name(name)}.{p}": tuple(t.shape) for p, t in _own_parameters(module)}
        fused = [s for s in tensors.values() if len(s) == 3]
        if not fused:
            continue  # a ModuleList of per-expert MLPs (older layouts): not fused tensors
        experts_count = fused[0][0]
        parent = name.rpartition(".")[0]
        router = next((f"{parent}.{r}" for r in ROUTER_NAMES if f"{parent}.{r}" in modules), None)
        if router is not None:
            routers.append(modules[router])
        shared = [base_name(n) for s in SHARED_NAMES if f"{parent}.{s}" in modules
                  for n, m in modules[f"{parent}.{s}"].named_modules(prefix=f"{parent}.{s}")
                  if _is_linear(m) and not _is_lora_part(n)]
        blocks.append(MoeBlock(base_name(name), tensors, router and base_name(router), sorted(set(shared))))
    if not blocks:
        return None
    return MoeLayout(blocks, experts_count, _top_k(model, routers))


def _own_parameters(module):
    """A module's own parameters; through peft's ParamWrapper nesting when the experts are adapted."""
    inner = module
    while hasattr(inner, "base_layer") and hasattr(inner, "parameter_name"):
        inner = inner.base_layer
    return [(n, p) for n, p in inner.named_parameters(recurse=False)]


def _is_linear(module) -> bool:
    """An nn.Linear, or peft's wrapper of one (its base_layer)."""
    import torch

    while hasattr(module, "base_layer"):
        module = module.base_layer
    return isinstance(module, torch.nn.Linear)


def _is_lora_part(name: str) -> bool:
    return any(part.startswith("lora_") for part in name.split("."))


@dataclass(frozen=True)
class MoeCounts:
    total: int
    active: int
    """Parameters one token goes through: all but the experts, plus top_k / num_experts of them."""
    experts: int
    """Parameters in the routed experts."""
    num_experts: int
    top_k: int | None
    layers: int


def count(model, layout: MoeLayout | None = None) -> MoeCounts | None:
    """Exact total and active parameter counts of an MoE model (None for a dense one). Each token runs top_k
    of num_experts equally sized experts per MoE layer, so the active count is exact, not a sample."""
    layout = layout or moe_layout(model)
    if layout is None:
        return None
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    experts = sum(_numel(shape) for b in layout.blocks for shape in b.tensors.values())
    k = layout.top_k or layout.num_experts
    active = total - experts + experts * k // layout.num_experts
    return MoeCounts(total, active, experts, layout.num_experts, layout.top_k, len(layout.blocks))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def group_of(name: str, layout: MoeLayout | None) -> str:
    """The part of an MoE model a (module or parameter) name belongs to: `experts`, `router`, `shared experts`,
    `attention` or `other`."""
    name = base_name(name)
    if layout is not None:
        for b in layout.blocks:
            if name == b.experts or name.startswith(b.experts + "."):
                return "experts"
            if b.router and (name == b.router or name.startswith(b.router + ".")):
                return "router"
            parent = b.experts.rpartition(".")[0]
            if any(name.startswith(f"{parent}.{s}") for s in SHARED_NAMES):
                return "shared experts"
    if any(part in ("self_attn", "attention", "attn") for part in name.split(".")):
        return "attention"
    return "other"


def base_name(name: str) -> str:
    """A peft-wrapped name as the base model spells it."""
    name = name.removeprefix("base_model.model.")
    return name.replace(".base_layer", "")
