"""Stage 5: distributed set-up on the worker — the Trainer arguments that make the launch real.

The accelerate config in the Plan (`plan.launch.accelerate_config`, already merged with a team file)
is the one source: the launcher reads it, and `trainer_overrides` turns the same values into
TrainingArguments, so the two can't disagree. `prepare` applies the CPU FSDP shim (below, the only
place ftune patches a library), and `describe` reports what really happened, for logs and tests.
"""

from __future__ import annotations

import hashlib
from typing import Any

_SHIM_APPLIED = False


# ------------------------------------------------------------------------------ CPU FSDP shim
def apply_cpu_fsdp_shim() -> None:
    """Make FSDP work on CPU processes (gloo). Applied only when CUDA is absent; idempotent.

    Measured with accelerate 1.15 / torch 2.13, each patch fixes one silent or fatal failure:
    1. accelerate's state ignores an FSDP plugin on MULTI_CPU and trains plain DDP: promote it to FSDP.
    2. FSDP v1 with `device_id=cpu:N` fails its compute-device check ('cpu vs cpu:0'): treat a CPU
       device_id as none (the parameters already live on the CPU).
    3. FSDP v1's full state dict 'moves' the unsharded flat parameter to CPU, then frees its storage,
       which is the same storage on CPU: a segfault. Skip that move when it is already on CPU.
    """
    global _SHIM_APPLIED
    if _SHIM_APPLIED:
        return
    import contextlib

    import torch.distributed.fsdp._init_utils as fsdp_init
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType
    from torch.distributed.fsdp._flat_param import FlatParamHandle

    state_init = AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        state_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            self.distributed_type = DistributedType.FSDP
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP  # later states copy it

    device_from_id = fsdp_init._get_device_from_device_id

    def get_device(device_id, rank, device_handle):
        device = device_from_id(device_id, rank, device_handle)
        return None if device is not None and device.type == "cpu" else device

    to_cpu = FlatParamHandle.to_cpu

    def to_cpu_unless_there(self):
        return contextlib.nullcontext() if self.flat_param.device.type == "cpu" else to_cpu(self)

    AcceleratorState.__init__ = init
    fsdp_init._get_device_from_device_id = get_device
    FlatParamHandle.to_cpu = to_cpu_unless_there
    _SHIM_APPLIED = True


def prepare(plan) -> None:
    """Called by the worker before TrainingArguments/the Trainer exist."""
    if plan.recipe.distributed.strategy != "fsdp" or plan.device != "cpu":
        return
    import warnings

    import torch

    if torch.cuda.is_available():
        return
    warnings.filterwarnings("ignore", message=".*Module is put on CPU.*")
    apply_cpu_fsdp_shim()


# ------------------------------------------------------------------------------ TrainingArguments
def _fsdp_trainer_config(fsdp: dict[str, Any]) -> dict[str, Any]:
    """accelerate's fsdp_config block (fsdp_ keys) → TrainingArguments.fsdp_config."""
    out: dict[str, Any] = {k.removeprefix("fsdp_"): v for k, v in fsdp.items()}
    if isinstance(out.get("transformer_layer_cls_to_wrap"), str):
        out["transformer_layer_cls_to_wrap"] = out["transformer_layer_cls_to_wrap"].split(",")
    out["cpu_offload"] = bool(out.pop("offload_params", False))
    if out.get("auto_wrap_policy") == "NO_WRAP":
        out.pop("min_num_params", None)
    for key in ("backward_prefetch",):
        if key in out:
            out[key] = str(out[key]).lower()
    return out


def trainer_overrides(plan) -> dict:
    """Extra TrainingArguments the worker merges in: use_cpu, ddp_backend, fsdp, deepspeed, precision."""
    cfg = plan.launch.accelerate_config
    kind = cfg.get("distributed_type", "NO")
    cpu = plan.device == "cpu"
    extra: dict[str, Any] = {"use_cpu": cpu}
    if kind in ("MULTI_GPU", "FSDP") and plan.world_size > 1:
        extra["ddp_backend"] = "gloo" if cpu else "nccl"
    mp = cfg.get("mixed_precision", plan.mixed_precision)
    extra["bf16"], extra["fp16"] = mp == "bf16", mp == "fp16"
    if kind == "FSDP":
        fsdp = _fsdp_trainer_config(cfg.get("fsdp_config", {}))
        extra["fsdp"] = True
        extra["fsdp_config"] = fsdp
        if fsdp.get("activation_checkpointing"):
            # FSDP-native checkpointing after wrapping replaces the Trainer's (a redundant all-gather otherwise)
            extra["activation_checkpointing"] = False
            extra["activation_checkpointing_kwargs"] = None
    if kind == "DEEPSPEED":
        extra["deepspeed"] = deepspeed_trainer_config(cfg.get("deepspeed_config", {}))
    return extra


def deepspeed_trainer_config(ds: dict[str, Any]) -> dict | str:
    """TrainingArguments.deepspeed: the user's JSON file as is, or a ZeRO config with `auto` values."""
    if ds.get("deepspeed_config_file"):
        return ds["deepspeed_config_file"]
    zero: dict[str, Any] = {"stage": ds.get("zero_stage", 2)}
    if ds.get("offload_optimizer_device", "none") != "none":
        zero["offload_optimizer"] = {"device": ds["offload_optimizer_device"], "pin_memory": True}
    if ds.get("offload_param_device", "none") != "none":
        zero["offload_param"] = {"device": ds["offload_param_device"], "pin_memory": True}
    if zero["stage"] == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    return {
        "zero_optimization": zero,
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
    }


# ------------------------------------------------------------------------------ facts
def _is_dtensor(t) -> bool:
    return type(t).__name__ == "DTensor"


def _first_batch_fingerprint(trainer) -> dict[str, Any]:
    """What this rank's first training batch holds: tests compare ranks to prove they see different data."""
    try:
        batch = next(iter(trainer.get_train_dataloader()))
    except (StopIteration, TypeError, ValueError):
        return {}
    ids = batch["input_ids"].detach().cpu()
    return {"first_batch_shape": list(ids.shape), "first_batch_sum": int(ids.sum()),
            "first_batch_sha1": hashlib.sha1(ids.numpy().tobytes()).hexdigest()}


def describe(model, trainer) -> dict:
    """Facts about the run as it really is: world size, rank, wrapping, sharding, data seen.

    The Trainer wraps the model only inside `train()`. Called before that, this also registers a
    callback that rewrites `<run>/distributed.rank<N>.json` with the wrapped facts at train begin.
    """
    _facts_after_wrapping(trainer)
    return _facts(model, trainer)


def _facts_after_wrapping(trainer) -> None:
    import json
    from pathlib import Path

    from transformers import TrainerCallback

    if any(type(c).__name__ == "DistributedFacts" for c in trainer.callback_handler.callbacks):
        return

    class DistributedFacts(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            facts = _facts(trainer.model, trainer)
            path = Path(args.output_dir).parent / f"distributed.rank{facts['rank']}.json"
            path.write_text(json.dumps(facts, default=str) + "\n")

    trainer.add_callback(DistributedFacts())


def _facts(model, trainer) -> dict:
    import torch.distributed as dist

    wrapped = getattr(trainer, "model_wrapped", None) or model
    acc = getattr(trainer, "accelerator", None)
    fsdp_units = [m for m in wrapped.modules()
                  if type(m).__name__ == "FullyShardedDataParallel" or type(m).__name__.startswith("FSDP")]
    params = list(wrapped.parameters())
    facts: dict[str, Any] = {
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "rank": dist.get_rank() if dist.is_initialized() else 0,
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "distributed_type": str(acc.distributed_type).rsplit(".", 1)[-1] if acc is not None else None,
        "fsdp_version": getattr(getattr(acc.state, "fsdp_plugin", None), "fsdp_version", None) if acc else None,
        "wrapper": type(wrapped).__name__,
        "ddp": type(wrapped).__name__ == "DistributedDataParallel",
        "fsdp_units": len(fsdp_units),
        "fsdp_unit_classes": sorted({type(m).__name__ for m in fsdp_units}),
        "dtensor_params": sum(_is_dtensor(p) for p in params),
        "params": len(params),
        "local_numel": sum(p.to_local().numel() if _is_dtensor(p) else p.numel() for p in params),
        "full_numel": sum(p.numel() for p in params),
    }
    facts.update(_first_batch_fingerprint(trainer))
    return facts


# ------------------------------------------------------------------------------ before launch
def check_wrap_classes(recipe, model=None) -> list[tuple[str, str, str]]:
    """(path, message, hint) when FSDP's transformer wrap classes are not in the model.

    `model` is the recipe's model on the meta device (built here from its config when not given):
    a class name that matches no module would silently wrap nothing but the root.
    """
    d = recipe.distributed
    if d.strategy != "fsdp":
        return []
    from ftune.recipe.schema import FsdpSection

    fsdp = d.fsdp or FsdpSection()
    if fsdp.auto_wrap_policy != "transformer":
        return []
    if model is None:
        from ftune.worker.model import build_meta_model

        model = build_meta_model(recipe)
    present = {type(m).__name__ for m in model.modules()}
    layers = sorted(n for n in present if n.endswith(("DecoderLayer", "EncoderLayer", "Block", "Layer")))
    if fsdp.transformer_layer_cls:
        missing = [c for c in fsdp.transformer_layer_cls if c not in present]
        if missing:
            return [("distributed.fsdp.transformer_layer_cls",
                     f"wrap class{'es' if len(missing) > 1 else ''} {', '.join(missing)} not found in "
                     f"{type(model).__name__}",
                     f"layer classes in this model: {', '.join(layers) or 'none'}; "
                     f"or leave transformer_layer_cls unset to use the model's _no_split_modules")]
        return []
    declared = list(getattr(model, "_no_split_modules", None) or [])
    usable = [c for c in declared if c in present]
    if not usable:
        return [("distributed.fsdp.auto_wrap_policy",
                 f"{type(model).__name__} declares no usable _no_split_modules "
                 f"({', '.join(declared) or 'none'}), so the transformer policy would wrap only the root",
                 f"set `distributed.fsdp.transformer_layer_cls` (classes in this model: {', '.join(layers) or 'none'})"
                 " or `auto_wrap_policy: size`")]
    return []
