"""Recipe `distributed:` → the accelerate config (`<run>/accelerate.yaml`) and the launch argv.

Light module: no torch at import time. Decisions follow facts measured with accelerate 1.15 /
torch 2.13 on CPU (docs/distributed.md):
- DDP uses the multi-GPU launch type (torchrun) even on CPU; accelerate's MULTI_CPU type silently
  starts one process without MPI. The worker tells the Trainer `use_cpu`, so ranks join over gloo.
- FSDP on CPU launches as FSDP; the worker's CPU shim (ftune/worker/distributed.py) makes accelerate
  honour it. `sync_module_states` is forced off on CPU.
- Every run goes through `accelerate launch`, one process included.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from ftune.errors import FtuneError

DISTRIBUTED_TYPE = {"none": "NO", "ddp": "MULTI_GPU", "fsdp": "FSDP", "deepspeed": "DEEPSPEED"}
WRAP_POLICY = {"transformer": "TRANSFORMER_BASED_WRAP", "size": "SIZE_BASED_WRAP", "none": "NO_WRAP"}
V1_SHARDING = {"full_shard": "FULL_SHARD", "shard_grad_op": "SHARD_GRAD_OP", "hybrid_shard": "HYBRID_SHARD",
               "no_shard": "NO_SHARD"}
BACKWARD_PREFETCH = {"backward_pre": "BACKWARD_PRE", "backward_post": "BACKWARD_POST", "none": "NO_PREFETCH"}
STATE_DICT = {"full": "FULL_STATE_DICT", "sharded": "SHARDED_STATE_DICT"}
# Keys that decide the shape of the job: the Plan is computed from the recipe, so the recipe always wins.
STRUCTURAL = ("distributed_type", "num_processes", "num_machines", "machine_rank", "use_cpu", "mixed_precision")
DEFAULT_PORT = 29500


def visible_gpus() -> int:
    """CUDA devices this process can see; 0 without importing torch when no NVIDIA driver is present."""
    import os

    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return 0
    if shutil.which("nvidia-smi") is None and not Path("/proc/driver/nvidia").exists():
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_num_processes(distributed, gpus: int | None = None) -> tuple[int, str]:
    """Processes on this machine and the device: `auto` means the visible GPUs, else 1.

    `gpus` plans for that many GPUs instead of the visible ones (`ftune plan --gpus` on a laptop)."""
    gpus = visible_gpus() if gpus is None else gpus
    device = "cuda" if gpus > 0 else "cpu"
    if distributed.strategy == "none":
        return 1, device
    n = distributed.num_processes
    if n == "auto":
        n = gpus if gpus > 0 else 1
    return int(n), device


def _fsdp_config(fsdp, device: str, notes: list[str], adapter: bool = False,
                 wrap_classes: list[str] | None = None) -> dict[str, Any]:
    """accelerate's `fsdp_config` block (fsdp_-prefixed keys, as `accelerate config` writes them). `wrap_classes`:
    the layer classes the compiler found for the transformer policy (`ftune.plan.checks.preflight.wrap_classes`) when the
    recipe names none."""
    state_dict_type = fsdp.state_dict_type
    if adapter and fsdp.activation_checkpointing and state_dict_type == "sharded":
        # measured (peft 0.21): a sharded adapter checkpoint selects tensors by module name, which
        # checkpoint wrapping changes, and saves none. The adapter alone is small: gather it in full.
        notes.append("fsdp: adapter checkpoints use state_dict_type full (with FSDP activation checkpointing a "
                     "sharded adapter checkpoint would hold no tensors)")
        state_dict_type = "full"
    cfg: dict[str, Any] = {
        "fsdp_version": fsdp.version,
        "fsdp_auto_wrap_policy": WRAP_POLICY[fsdp.auto_wrap_policy],
        "fsdp_offload_params": fsdp.cpu_offload,
        "fsdp_state_dict_type": STATE_DICT[state_dict_type],
        "fsdp_cpu_ram_efficient_loading": fsdp.cpu_ram_efficient_loading,
        "fsdp_activation_checkpointing": fsdp.activation_checkpointing,
    }
    if fsdp.auto_wrap_policy == "transformer" and (classes := fsdp.transformer_layer_cls or wrap_classes):
        cfg["fsdp_transformer_layer_cls_to_wrap"] = ",".join(classes)
    if fsdp.auto_wrap_policy == "size":
        cfg["fsdp_min_num_params"] = fsdp.min_num_params
    sync = fsdp.sync_module_states if fsdp.sync_module_states is not None else fsdp.cpu_ram_efficient_loading
    if device == "cpu" and sync:
        notes.append("fsdp.sync_module_states forced off: it fails on CPU processes ('no available devices')")
        sync = False
    cfg["fsdp_sync_module_states"] = sync  # accelerate requires it with cpu_ram_efficient_loading
    if fsdp.version == 2:
        cfg["fsdp_reshard_after_forward"] = fsdp.reshard_after_forward and fsdp.sharding_strategy != "shard_grad_op"
    else:
        cfg["fsdp_reshard_after_forward"] = V1_SHARDING[fsdp.sharding_strategy]
        cfg["fsdp_forward_prefetch"] = fsdp.forward_prefetch
        cfg["fsdp_backward_prefetch"] = BACKWARD_PREFETCH[fsdp.backward_prefetch]
        cfg["fsdp_use_orig_params"] = True  # needed for a frozen base with trainable adapters
    return cfg


def _deepspeed_config(ds, recipe, recipe_dir: Path) -> dict[str, Any]:
    if ds.config is not None:
        path = (recipe_dir / ds.config).resolve()
        if not path.is_file():
            raise FtuneError(f"distributed.deepspeed.config: file not found: {path}",
                             hint="the path is relative to the recipe file")
        return {"deepspeed_config_file": str(path), "zero3_init_flag": _json_stage(path) == 3}
    return {
        "zero_stage": ds.stage,
        "offload_optimizer_device": "cpu" if ds.offload_optimizer else "none",
        "offload_param_device": "cpu" if ds.offload_params else "none",
        "zero3_init_flag": ds.stage == 3,
        "zero3_save_16bit_model": ds.stage == 3,
        "gradient_accumulation_steps": recipe.train.gradient_accumulation_steps,
        "gradient_clipping": recipe.train.max_grad_norm,
    }


def _json_stage(path: Path) -> int | None:
    try:
        return int(json.loads(path.read_text()).get("zero_optimization", {}).get("stage"))
    except (ValueError, TypeError, OSError):
        return None


def generate(recipe, *, device: str, num_processes: int, recipe_dir: Path,
             mixed_precision: str, wrap_classes: list[str] | None = None) -> tuple[dict, list[str]]:
    """The config the recipe describes (before merging a team file), with the FSDP wrap classes the compiler found
    on the model when the recipe names none."""
    d = recipe.distributed
    notes: list[str] = []
    multi_node = d.num_machines > 1
    mp = mixed_precision
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": DISTRIBUTED_TYPE[d.strategy],
        "mixed_precision": mp,
        "num_machines": d.num_machines,
        "machine_rank": d.machine_rank,
        # accelerate's num_processes counts every process of the job; the recipe's counts one machine
        "num_processes": num_processes * d.num_machines,
        "use_cpu": device == "cpu",
        "gpu_ids": "all",
        "rdzv_backend": d.rdzv_backend,
        "same_network": d.same_network,
        # single machine: 0 lets accelerate pick a free port, so concurrent runs don't collide
        "main_process_port": d.main_process_port or (DEFAULT_PORT if multi_node else 0),
    }
    if d.main_process_ip is not None or multi_node:
        cfg["main_process_ip"] = d.main_process_ip
    if d.strategy == "ddp" and device == "cpu":
        notes.append("ddp on CPU: launched like multi-GPU (torchrun) with the Trainer on CPU over gloo; "
                     "accelerate's MULTI_CPU type would start only one process")
    if d.strategy == "fsdp":
        from ftune.recipe.schema import FsdpSection

        cfg["fsdp_config"] = _fsdp_config(d.fsdp or FsdpSection(), device, notes, recipe.peft.uses_peft_library,
                                          wrap_classes)
        if device == "cpu":
            notes.append("fsdp on CPU: gloo process group with ftune's CPU FSDP shim (tests and laptops)")
    if d.strategy == "deepspeed":
        from ftune.recipe.schema import DeepSpeedSection

        cfg["deepspeed_config"] = _deepspeed_config(d.deepspeed or DeepSpeedSection(), recipe, recipe_dir)
    return cfg, notes


def _explicit(section, field: str) -> bool:
    return section is not None and field in section.model_fields_set


def _recipe_field(recipe, key: str, sub: str | None) -> tuple[Any, str]:
    """The recipe section and field name an accelerate key comes from (for 'explicit' checks and notes)."""
    d = recipe.distributed
    if sub == "fsdp_config":
        name = key.removeprefix("fsdp_")
        name = {"offload_params": "cpu_offload", "transformer_layer_cls_to_wrap": "transformer_layer_cls",
                "reshard_after_forward": "reshard_after_forward"}.get(name, name)
        return d.fsdp, f"distributed.fsdp.{name}"
    if sub == "deepspeed_config":
        name = {"zero_stage": "stage", "offload_optimizer_device": "offload_optimizer",
                "offload_param_device": "offload_params", "deepspeed_config_file": "config"}.get(key, key)
        return d.deepspeed, f"distributed.deepspeed.{name}"
    return d, f"distributed.{key}"


def _read_team_file(path: Path) -> dict:
    import yaml

    if not path.is_file():
        raise FtuneError(f"accelerate config not found: {path}",
                         hint="distributed.accelerate_config is relative to the recipe file")
    try:
        data = json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())
    except (ValueError, yaml.YAMLError) as err:
        raise FtuneError(f"can't read accelerate config {path}: {err}",
                         hint="it must be a YAML or JSON file as written by `accelerate config`") from None
    if not isinstance(data, dict):
        raise FtuneError(f"accelerate config {path} is not a mapping", hint="write it with `accelerate config`")
    return data


def merge(team: dict, ours: dict, recipe, notes: list[str]) -> dict:
    """Team file as the base; ftune's keys on top. Explicit recipe keys win; conflicts become notes."""
    out = {k: v for k, v in team.items()}
    for key, value in ours.items():
        if isinstance(value, dict):
            sub_team = team.get(key) if isinstance(team.get(key), dict) else {}
            sub_out = dict(sub_team)
            for k, v in value.items():
                sub_out[k] = _pick(k, v, sub_team, recipe, key, notes)
            out[key] = sub_out
        else:
            out[key] = _pick(key, value, team, recipe, None, notes)
    return out


def _pick(key: str, ours: Any, team: dict, recipe, sub: str | None, notes: list[str]) -> Any:
    if key not in team or team[key] == ours:
        return ours
    section, path = _recipe_field(recipe, key, sub)
    where = f"{sub}.{key}" if sub else key
    if key in STRUCTURAL or _explicit(section, path.rsplit(".", 1)[1]):
        notes.append(f"accelerate_config: {where}: team file has {team[key]!r}, recipe ({path}) sets {ours!r}; "
                     "the recipe wins")
        return ours
    notes.append(f"accelerate_config: {where}: taken from the team file ({team[key]!r}); "
                 f"set {path} in the recipe to override")
    return team[key]


def build(recipe, *, device: str, num_processes: int, recipe_dir: Path,
          mixed_precision: str, wrap_classes: list[str] | None = None) -> tuple[dict, list[str]]:
    """The accelerate config (written as <run>/accelerate.yaml) and notes explaining decisions.

    The compiler has checked this machine first (`ftune.plan.checks.environment`), located in the recipe, and found the
    FSDP wrap classes on the meta model (`wrap_classes`; None when it wasn't built)."""
    cfg, notes = generate(recipe, device=device, num_processes=num_processes, recipe_dir=Path(recipe_dir),
                          mixed_precision=mixed_precision, wrap_classes=wrap_classes)
    if recipe.distributed.accelerate_config:
        team = _read_team_file((Path(recipe_dir) / recipe.distributed.accelerate_config).resolve())
        cfg = merge(team, cfg, recipe, notes)
        # keys that make no sense for the recipe's strategy would mislead accelerate: drop them
        if cfg["distributed_type"] != "FSDP" and cfg.pop("fsdp_config", None):
            notes.append("accelerate_config: fsdp_config dropped (distributed.strategy is not fsdp)")
        if cfg["distributed_type"] != "DEEPSPEED" and cfg.pop("deepspeed_config", None):
            notes.append("accelerate_config: deepspeed_config dropped (distributed.strategy is not deepspeed)")
    return cfg, notes


def launch_command(config_file: Path, plan_file: Path, *, python: str = sys.executable) -> list[str]:
    """argv: [python, -m, accelerate.commands.launch, --quiet, --config_file, <cfg>, -m, ftune.worker, <plan>]"""
    # --quiet: when a worker fails, accelerate would add its own launcher traceback; ftune reports the
    # worker's error (from <run>/error.json) instead.
    return [python, "-m", "accelerate.commands.launch", "--quiet", "--config_file", str(config_file),
            "-m", "ftune.worker", str(plan_file)]
