"""How a recipe's bytes lie over the devices, for `ftune plan`: the FSDP units the wrap policy makes and what each rank
keeps, the strategy's `Layout` the byte accounting reads (`ftune.estimate.memory.per_device`), and the memory of
this machine's device."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ftune.estimate.facts import ParamFact
from ftune.estimate.memory import Layout, layer_split, weight_bytes
from ftune.estimate.optimizer import galore_low_rank
from ftune.plan.preference import reference_copy
from ftune.recipe.schema import Recipe


@dataclass(frozen=True)
class FsdpLayout:
    units: int
    """FSDP units the wrap policy creates, the root included."""
    unit_classes: dict[str, int]
    shard_ranks: int
    """Ranks one shard spans (world size; processes per node for hybrid_shard)."""
    shard_bytes_per_rank: int
    largest_unit_bytes: int
    """The largest non-root unit: all-gathered while it computes (and the next one while prefetched)."""
    root_unit_bytes: int
    """Parameters left to the root unit (embeddings, final norm, head): gathered for the whole step."""



def layer_classes(model, recipe: Recipe) -> set[str]:
    fsdp = recipe.distributed.fsdp
    if fsdp is not None and fsdp.transformer_layer_cls:
        return set(fsdp.transformer_layer_cls)
    return set(getattr(model, "_no_split_modules", None) or [])


def fsdp_layout(model, recipe: Recipe, facts: list[ParamFact], world_size: int, num_processes: int,
                 layer_classes: set[str]) -> FsdpLayout:
    """The units accelerate's wrap policy creates (plus the root), and what each rank keeps."""
    fsdp = recipe.distributed.fsdp
    assert fsdp is not None
    bytes_of = {f.name: f for f in facts}
    def unit_bytes(module, prefix: str) -> int:
        return sum(weight_bytes(bytes_of[prefix + n], recipe.kbit is not None and
                                recipe.kbit.double_quant)
                   for n, _ in module.named_parameters() if prefix + n in bytes_of)

    units: list[tuple[str, int]] = []
    if fsdp.auto_wrap_policy == "transformer":
        for name, m in model.named_modules():
            if type(m).__name__ in layer_classes:
                units.append((type(m).__name__, unit_bytes(m, name + ".")))
    elif fsdp.auto_wrap_policy == "size":
        def visit(module, prefix: str, root: bool) -> int:  # torch's size_based_auto_wrap_policy, bottom-up
            rest = sum(visit(c, f"{prefix}{n}.", False) for n, c in module.named_children())
            rest += sum(p.numel() for p in module.parameters(recurse=False))
            wrappable = type(module).__name__ not in ("ModuleList", "ModuleDict")  # torch excludes containers
            if not root and wrappable and rest >= fsdp.min_num_params:
                units.append((type(module).__name__, unit_bytes(module, prefix)))
                return 0
            return rest

        visit(model, "", True)
    total = unit_bytes(model, "")
    root = total - sum(b for _, b in units)
    classes: dict[str, int] = {}
    for cls, _ in units:
        classes[cls] = classes.get(cls, 0) + 1
    classes[f"root ({type(model).__name__})"] = 1
    ranks = num_processes if fsdp.sharding_strategy == "hybrid_shard" else world_size
    ranks = 1 if fsdp.sharding_strategy == "no_shard" else ranks
    par = recipe.distributed.parallelism  # accelerate's FSDP2 shards over the dp_shard x cp mesh (replicas: HSDP)
    ranks = par.dp_shard * par.cp if par is not None else ranks
    return FsdpLayout(len(units) + 1, classes, ranks, -(-total // ranks), max([b for _, b in units], default=0),
                      root)


def detect_device_memory() -> tuple[str, int | None]:
    """('cuda', bytes of GPU 0) when torch sees a GPU, else ('cpu', None)."""
    import torch

    if torch.cuda.is_available():
        return "cuda", torch.cuda.get_device_properties(0).total_memory
    return "cpu", None


def host_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def make_layout(recipe: Recipe, world_size: int, device: str, fsdp: FsdpLayout | None,
                facts: list[ParamFact] = ()) -> Layout:
    dist, train = recipe.distributed, recipe.train
    checkpointing = train.gradient_checkpointing or bool(dist.fsdp and dist.fsdp.activation_checkpointing)
    common = dict(optimizer=train.optimizer, checkpointing=checkpointing, device=device,
                  fused_loss=train.kernels == "liger", offload_activations=train.activation_offloading,
                  reference_copy=train.objective if reference_copy(recipe) else None,
                  double_quant=bool(recipe.kbit and recipe.kbit.double_quant),
                  low_rank=galore_low_rank(train))
    if dist.strategy == "fsdp" and fsdp is not None and dist.fsdp is not None:
        return Layout(**common, strategy="fsdp", shard_ranks=fsdp.shard_ranks,
                      fsdp_sharding=dist.fsdp.sharding_strategy, fsdp_offload=dist.fsdp.cpu_offload,
                      largest_unit_bytes=fsdp.largest_unit_bytes, root_unit_bytes=fsdp.root_unit_bytes,
                      largest_unit_grad_bytes=fsdp.largest_unit_bytes if recipe.peft.trains_whole_model else 0)
    if dist.strategy == "deepspeed":
        ds = dist.deepspeed
        stage = ds.stage if ds else 2
        largest = layer_split(facts, common["double_quant"])[0] if stage == 3 else 0
        return Layout(**common, strategy="deepspeed", shard_ranks=world_size, zero_stage=stage,
                      largest_unit_bytes=largest,
                      offload_optimizer=bool(ds and ds.offload_optimizer),
                      offload_params=bool(ds and ds.offload_params),
                      master_weights=train.mixed_precision != "no")
    tp = dist.parallelism is not None and dist.parallelism.tp > 1  # accelerate keeps a tp model out of DDP
    return Layout(**common, strategy="none" if tp else dist.strategy, shard_ranks=world_size)
