"""Distributed rules: strategy vs. processes and machines, FSDP and DeepSpeed options.

`RULES` read only the recipe (light, run when a recipe loads). `JOB_RULES` read the job's shape (machines, this
machine's rank, machine 0's address), which a launcher's environment may set (`ftune.plan.cluster`): they run in
the recipe tier of `ftune.plan.checks`, after the compiler applied that environment (and in `validate` and
`launch-script`, on the shape the recipe or the flags give). Checks that need the device and the
installed packages are in `ftune.plan.checks.environment`; the wrap-class check needs the model's structure
and lives with the meta-device preflight (`ftune.plan.checks.preflight`).
`fsdp` options with another strategy are a core rule (`core.fsdp_options_need_fsdp`).
"""

from __future__ import annotations

from collections.abc import Iterator

from ftune.errors import Problem
from ftune.recipe.rules import Rule
from ftune.recipe.schema import Recipe

V2_SHARDING = ("full_shard", "shard_grad_op")


def one_process_without_strategy(recipe: Recipe) -> Iterator[Problem]:
    d = recipe.distributed
    if d.strategy != "none":
        return
    if isinstance(d.num_processes, int) and d.num_processes > 1:
        yield Problem.at("distributed.num_processes",
                        f"num_processes is {d.num_processes} but distributed.strategy is 'none' (one process)",
                        "add the override `distributed.strategy=ddp` (or fsdp / deepspeed), or remove `strategy: none` "
                        "from the recipe: several processes with no strategy written run DDP")
    if d.num_machines > 1:
        yield Problem.at("distributed.num_machines",
                        f"num_machines is {d.num_machines} but distributed.strategy is 'none'",
                        "add the override `distributed.strategy=ddp` (or fsdp / deepspeed), or remove `strategy: none` "
                        "from the recipe: a multi-node job with no strategy written runs DDP")


def multi_node_needs_address(recipe: Recipe) -> Iterator[Problem]:
    d = recipe.distributed
    if d.num_machines > 1 and not d.main_process_ip:
        yield Problem.at("distributed.main_process_ip",
                        f"a {d.num_machines}-machine job needs the address of machine 0",
                        "set `distributed.main_process_ip` (and main_process_port, default 29500) "
                        "to machine 0's address, the same on every machine")


def machine_rank_in_range(recipe: Recipe) -> Iterator[Problem]:
    d = recipe.distributed
    if d.machine_rank >= d.num_machines:
        yield Problem.at("distributed.machine_rank",
                        f"machine_rank {d.machine_rank} is out of range for num_machines {d.num_machines} "
                        f"(0..{d.num_machines - 1})",
                        "give each machine its rank with an override, e.g. `distributed.machine_rank=1`")


def no_8bit_with_fsdp(recipe: Recipe) -> Iterator[Problem]:
    q = recipe.kbit
    if recipe.distributed.strategy == "fsdp" and q is not None and q.bits == 8:
        yield Problem.at("quantization.bits",
                        "8-bit quantization can't be sharded with FSDP (bitsandbytes Int8Params are not "
                        "FSDP-compatible)",
                        "use `quantization.bits: 4` with quant_storage equal to model.dtype (QLoRA + FSDP), "
                        "or `distributed.strategy: ddp`")


def fsdp_options_fit_version(recipe: Recipe) -> Iterator[Problem]:
    f = recipe.distributed.fsdp
    if recipe.distributed.strategy != "fsdp" or f is None:
        return
    if f.version == 2 and f.sharding_strategy not in V2_SHARDING:
        yield Problem.at("distributed.fsdp.sharding_strategy",
                        f"sharding_strategy '{f.sharding_strategy}' needs FSDP version 1; FSDP 2 supports "
                        f"{' and '.join(V2_SHARDING)}",
                        "use `full_shard` / `shard_grad_op`, or set `distributed.fsdp.version: 1`")
    if f.transformer_layer_cls and f.auto_wrap_policy != "transformer":
        yield Problem.at("distributed.fsdp.transformer_layer_cls",
                        f"transformer_layer_cls is only used by auto_wrap_policy 'transformer' "
                        f"(this recipe uses '{f.auto_wrap_policy}')",
                        "set `distributed.fsdp.auto_wrap_policy: transformer`, or remove transformer_layer_cls")


def deepspeed_options_consistent(recipe: Recipe) -> Iterator[Problem]:
    ds = recipe.distributed.deepspeed
    if recipe.distributed.strategy != "deepspeed" or ds is None:
        return
    if ds.offload_params and ds.stage != 3:
        yield Problem.at("distributed.deepspeed.offload_params",
                        f"parameter offload needs ZeRO stage 3 (this recipe uses stage {ds.stage})",
                        "set `distributed.deepspeed.stage: 3`, or use offload_optimizer only")
    if ds.config is not None:
        also = sorted(ds.model_fields_set - {"config"})
        if also:
            yield Problem.at(f"distributed.deepspeed.{also[0]}",
                            f"`distributed.deepspeed.config` is used as is, so {', '.join(also)} would be ignored",
                            "put these settings in the DeepSpeed JSON file, or drop `config`")


def expert_parallel_refused(recipe: Recipe) -> Iterator[Problem]:
    """distributed.expert_parallel_size > 1: refused, with the reason that fits the recipe."""
    size = recipe.distributed.expert_parallel_size
    if size is None or size == 1:
        return
    d = recipe.distributed
    if d.strategy in ("none", "ddp"):
        why = (f"distributed.strategy {d.strategy} keeps a whole model on every rank" if d.strategy == "ddp"
               else "one process has no ranks to split the experts over")
        hint = "remove distributed.expert_parallel_size; shard the experts with `distributed.strategy: fsdp`"
    else:
        why = (f"{d.strategy} shards the experts' tensors with every other parameter, but ftune has no expert-"
               "parallel training path: transformers 5.23 splits experts only when loading for inference "
               "(DistributedConfig(ep_size)), and neither accelerate 1.15 nor the Trainer trains such a model")
        hint = "remove distributed.expert_parallel_size; FSDP already spreads the experts' memory over the ranks"
    yield Problem.at("distributed.expert_parallel_size", f"expert parallelism ({size} ranks) is refused: {why}",
                     hint + " (docs/moe.md)")


RULES: list[Rule] = [
    no_8bit_with_fsdp,
    fsdp_options_fit_version,
    deepspeed_options_consistent,
    expert_parallel_refused,
]

JOB_RULES: list[Rule] = [
    one_process_without_strategy,
    multi_node_needs_address,
    machine_rank_in_range,
]
