"""Distributed rules: strategy vs. processes and machines, FSDP and DeepSpeed options.

`RULES` read only the recipe (light, run by `ftune validate`). `check_environment` needs the device
and the installed packages, so the plan compiler calls it before launch; the wrap-class check needs
the model's structure and lives with the meta-device preflight (`ftune/worker/distributed.py`).
`fsdp` options with another strategy are a core rule (`core.fsdp_options_need_fsdp`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

from ftune.recipe.rules import Rule, Violation
from ftune.recipe.schema import Recipe

V2_SHARDING = ("full_shard", "shard_grad_op")


def one_process_without_strategy(recipe: Recipe) -> Iterator[Violation]:
    d = recipe.distributed
    if d.strategy != "none":
        return
    if isinstance(d.num_processes, int) and d.num_processes > 1:
        yield Violation("distributed.num_processes",
                        f"num_processes is {d.num_processes} but distributed.strategy is 'none' (one process)",
                        "set `distributed.strategy: ddp` (or fsdp / deepspeed) to use several processes")
    if d.num_machines > 1:
        yield Violation("distributed.num_machines",
                        f"num_machines is {d.num_machines} but distributed.strategy is 'none'",
                        "set `distributed.strategy: ddp`, fsdp or deepspeed for a multi-node job")


def multi_node_needs_address(recipe: Recipe) -> Iterator[Violation]:
    d = recipe.distributed
    if d.num_machines > 1 and not d.main_process_ip:
        yield Violation("distributed.main_process_ip",
                        f"a {d.num_machines}-machine job needs the address of machine 0",
                        "set `distributed.main_process_ip` (and main_process_port, default 29500) "
                        "to machine 0's address, the same on every machine")


def machine_rank_in_range(recipe: Recipe) -> Iterator[Violation]:
    d = recipe.distributed
    if d.machine_rank >= d.num_machines:
        yield Violation("distributed.machine_rank",
                        f"machine_rank {d.machine_rank} is out of range for num_machines {d.num_machines} "
                        f"(0..{d.num_machines - 1})",
                        "give each machine its rank with an override, e.g. `distributed.machine_rank=1`")


def no_8bit_with_fsdp(recipe: Recipe) -> Iterator[Violation]:
    q = recipe.quantization
    if recipe.distributed.strategy == "fsdp" and q is not None and q.bits == 8:
        yield Violation("quantization.bits",
                        "8-bit quantization can't be sharded with FSDP (bitsandbytes Int8Params are not "
                        "FSDP-compatible)",
                        "use `quantization.bits: 4` with quant_storage equal to model.dtype (QLoRA + FSDP), "
                        "or `distributed.strategy: ddp`")


def fsdp_options_fit_version(recipe: Recipe) -> Iterator[Violation]:
    f = recipe.distributed.fsdp
    if recipe.distributed.strategy != "fsdp" or f is None:
        return
    if f.version == 2 and f.sharding_strategy not in V2_SHARDING:
        yield Violation("distributed.fsdp.sharding_strategy",
                        f"sharding_strategy '{f.sharding_strategy}' needs FSDP version 1; FSDP 2 supports "
                        f"{' and '.join(V2_SHARDING)}",
                        "use `full_shard` / `shard_grad_op`, or set `distributed.fsdp.version: 1`")
    if f.transformer_layer_cls and f.auto_wrap_policy != "transformer":
        yield Violation("distributed.fsdp.transformer_layer_cls",
                        f"transformer_layer_cls is only used by auto_wrap_policy 'transformer' "
                        f"(this recipe uses '{f.auto_wrap_policy}')",
                        "set `distributed.fsdp.auto_wrap_policy: transformer`, or remove transformer_layer_cls")


def fsdp_v1_adapters_refused(recipe: Recipe) -> Iterator[Violation]:
    """peft 0.21 + FSDP v1 saves adapters with zero tensors (measured): refuse rather than ship that."""
    f = recipe.distributed.fsdp
    if recipe.distributed.strategy == "fsdp" and f is not None and f.version == 1 and recipe.peft.uses_peft_library:
        yield Violation("distributed.fsdp.version",
                        f"FSDP version 1 with a peft adapter ({recipe.peft.method}) saves an adapter with zero "
                        "tensors and checkpoints that restore nothing (peft 0.21)",
                        "use `distributed.fsdp.version: 2` (the default), or `distributed.strategy: ddp`")


def deepspeed_options_consistent(recipe: Recipe) -> Iterator[Violation]:
    ds = recipe.distributed.deepspeed
    if recipe.distributed.strategy != "deepspeed" or ds is None:
        return
    if ds.offload_params and ds.stage != 3:
        yield Violation("distributed.deepspeed.offload_params",
                        f"parameter offload needs ZeRO stage 3 (this recipe uses stage {ds.stage})",
                        "set `distributed.deepspeed.stage: 3`, or use offload_optimizer only")
    if ds.config is not None:
        also = sorted(ds.model_fields_set - {"config"})
        if also:
            yield Violation(f"distributed.deepspeed.{also[0]}",
                            f"`distributed.deepspeed.config` is used as is, so {', '.join(also)} would be ignored",
                            "put these settings in the DeepSpeed JSON file, or drop `config`")


RULES: list[Rule] = [
    one_process_without_strategy,
    multi_node_needs_address,
    machine_rank_in_range,
    no_8bit_with_fsdp,
    fsdp_options_fit_version,
    fsdp_v1_adapters_refused,
    deepspeed_options_consistent,
]


# ------------------------------------------------------------------------ needs device / packages
def check_environment(recipe: Recipe, device: str, num_processes: int,
                      recipe_dir: str | Path = ".") -> list[tuple[str, str, str]]:
    """(path, message, hint) problems that depend on this machine: GPUs, installed packages, files."""
    d = recipe.distributed
    found: list[tuple[str, str, str]] = []
    if d.strategy == "deepspeed":
        if importlib.util.find_spec("deepspeed") is None:
            found.append(("distributed.strategy", "strategy 'deepspeed' needs the deepspeed package, which is "
                          "not installed", "pip install 'ftune[deepspeed]'  (or use `distributed.strategy: fsdp`)"))
        elif device == "cpu":
            found.append(("distributed.strategy", "DeepSpeed needs GPUs; this machine has none",
                          "use `distributed.strategy: fsdp` or `ddp` on CPU"))
        if d.deepspeed is not None and d.deepspeed.config is not None:
            path = (Path(recipe_dir) / d.deepspeed.config).resolve()
            if not path.is_file():
                found.append(("distributed.deepspeed.config", f"DeepSpeed config not found: {path}",
                              "the path is relative to the recipe file"))
    if d.accelerate_config is not None:
        path = (Path(recipe_dir) / d.accelerate_config).resolve()
        if not path.is_file():
            found.append(("distributed.accelerate_config", f"accelerate config not found: {path}",
                          "the path is relative to the recipe file"))
    if device == "cuda" and d.strategy != "none":
        from ftune.launch.accelerate_config import visible_gpus

        gpus = visible_gpus()
        if num_processes > gpus:
            found.append(("distributed.num_processes",
                          f"num_processes is {num_processes} but this machine sees {gpus} GPU(s)",
                          f"set `distributed.num_processes: {gpus}` or `auto`, or check CUDA_VISIBLE_DEVICES"))
    f = d.fsdp
    if device == "cpu" and d.strategy == "fsdp" and f is not None and f.cpu_ram_efficient_loading:
        found.append(("distributed.fsdp.cpu_ram_efficient_loading",
                      "cpu_ram_efficient_loading needs GPUs (it broadcasts rank 0's weights with "
                      "sync_module_states, which fails on CPU processes)",
                      "remove it for CPU runs"))
    return found
