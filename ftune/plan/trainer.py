"""The exact keyword arguments of `TrainingArguments`, decided once by the compiler and stored in the Plan.

The worker calls `TrainingArguments(**plan.trainer)` and changes nothing, so `ftune run --dry-run` and
`ftune plan --format json` show what will run. Light: plain data, no transformers import. The distributed
part comes from the same accelerate config the launcher writes, so the two can't disagree.
"""

from __future__ import annotations

from typing import Any

from ftune.recipe.schedule import eval_schedule, evaluates, save_schedule
from ftune.recipe.schema import Recipe
from ftune.rundir import RunDir

LOWER_IS_BETTER = ("loss", "perplexity")
DISTRIBUTED_KEYS = ("ddp_backend", "fsdp", "fsdp_config", "deepspeed")
"""TrainingArguments that join the launch's process group: a one-process evaluation (`ftune eval`) leaves them out."""


def optimizer_kwargs(recipe: Recipe) -> dict[str, Any]:
    """`train.optimizer_args` → adam_beta1/2, adam_epsilon, optim_target_modules and the `optim_args` string."""
    args = dict(recipe.train.optimizer_args or {})
    out: dict[str, Any] = {}
    if "betas" in args:
        out["adam_beta1"], out["adam_beta2"] = (float(b) for b in args.pop("betas"))
    if "eps" in args:
        out["adam_epsilon"] = float(args.pop("eps"))
    if "target_modules" in args:
        out["optim_target_modules"] = args.pop("target_modules")
    if args:
        out["optim_args"] = ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in args.items())
    return out


def tracker_run_name(recipe: Recipe) -> str | None:
    """TrainingArguments.run_name, which W&B and MLflow both take: a tracker's `run_name`, else the recipe's name
    when a tracker is on (else transformers' default, the output dir, shows in their UIs)."""
    trackers = recipe.output.trackers
    chosen = [t.run_name for t in (trackers.wandb, trackers.mlflow) if t is not None and t.run_name] if trackers else []
    if chosen:
        return chosen[0]
    return recipe.name if {"wandb", "mlflow"} & set(recipe.output.report_to) else None


def training_arguments(recipe: Recipe, *, run: RunDir, device: str, world_size: int, mixed_precision: str,
                       accelerate_config: dict[str, Any], resuming: bool = False) -> dict[str, Any]:
    """Recipe + distributed settings → TrainingArguments kwargs (JSON-serialisable). `resuming`: the run continues
    from a checkpoint, whose start was evaluated already."""
    t, ev, ck = recipe.train, recipe.eval, recipe.checkpoint
    has_eval = recipe.data.eval is not None and evaluates(recipe)
    (eval_strategy, eval_steps), (save_strategy, save_steps) = eval_schedule(recipe), save_schedule(recipe)
    load_best = ck.load_best or bool(t.early_stopping)
    best_metric = t.early_stopping.metric if t.early_stopping else "eval_loss"
    kwargs: dict[str, Any] = dict(
        output_dir=str(run.checkpoints),
        num_train_epochs=t.epochs if t.epochs is not None else 1.0,
        max_steps=t.max_steps if t.max_steps is not None else -1,
        learning_rate=t.learning_rate,
        lr_scheduler_type=t.lr_scheduler,
        lr_scheduler_kwargs=dict(t.lr_scheduler_args or {}),
        # transformers 5: warmup_steps below 1 is a ratio of the total steps
        warmup_steps=t.warmup_steps if t.warmup_steps is not None else (t.warmup_ratio or 0.0),
        weight_decay=t.weight_decay,
        per_device_train_batch_size=t.per_device_batch_size,
        per_device_eval_batch_size=ev.batch_size or t.per_device_batch_size,
        gradient_accumulation_steps=t.gradient_accumulation_steps,
        activation_checkpointing=t.gradient_checkpointing,
        activation_checkpointing_kwargs={"use_reentrant": False} if t.gradient_checkpointing else None,
        bf16=mixed_precision == "bf16",
        fp16=mixed_precision == "fp16",
        optim=t.optimizer,
        **optimizer_kwargs(recipe),
        max_grad_norm=t.max_grad_norm,
        seed=t.seed,
        data_seed=t.seed,
        logging_steps=t.logging_steps,
        logging_first_step=True,
        # the Trainer's default replaces a NaN/inf step loss by the running mean (shown as 0 after a log):
        # ftune logs it as it is and stops the run on it (worker/callbacks.py NumericsGuard)
        logging_nan_inf_filter=False,
        neftune_noise_alpha=t.neftune_alpha,
        eval_strategy=eval_strategy if has_eval else "no",
        eval_steps=eval_steps,  # below 1: a ratio of the total steps (eval.per_epoch)
        # not again on resume: it would evaluate the checkpoint's model (logged already) and count for early stopping
        # as an evaluation without improvement, stopping a patience-1 run at once
        eval_on_start=ev.on_start and recipe.data.eval is not None and not resuming,
        save_strategy=save_strategy,
        save_steps=save_steps,
        save_total_limit=ck.keep,
        load_best_model_at_end=load_best,
        metric_for_best_model=best_metric if has_eval else None,
        greater_is_better=None if not has_eval else not best_metric.endswith(LOWER_IS_BETTER),
        report_to=[x for x in recipe.output.report_to if x != "none"] or "none",
        log_level=t.log_level,
        log_level_replica=t.log_level_replica,
        disable_tqdm=True,
        # no per-micro-batch token gather (a device sync every step): tokens/s comes from the data stage's counts
        include_num_input_tokens_seen="no",
        remove_unused_columns=False,
        use_cpu=device == "cpu",
        **speed_kwargs(recipe, device),
    )
    if recipe.data.streaming:
        # each process reads its own files of the stream (accelerate shards a datasets stream by file), instead of
        # rank 0 reading every batch and sending the others theirs
        kwargs["accelerator_config"] = {"dispatch_batches": False}
    if recipe.distributed.timeout is not None:
        kwargs["ddp_timeout"] = recipe.distributed.timeout
    name = tracker_run_name(recipe)
    if name is not None:
        kwargs["run_name"] = name
    kwargs.update(_distributed(accelerate_config, device=device, world_size=world_size))
    return kwargs


def speed_kwargs(recipe: Recipe, device: str) -> dict[str, Any]:
    """Speed levers: torch.compile, Liger kernels, length grouping, the dataloader."""
    t = recipe.train
    dl = t.dataloader
    out: dict[str, Any] = dict(
        # transformers 5: the sampler is named (LengthGroupedSampler for group_by_length)
        train_sampling_strategy="group_by_length" if t.group_by_length else "random",
        dataloader_num_workers=dl.workers,
        dataloader_pin_memory=dl.pin_memory and device == "cuda",
        dataloader_prefetch_factor=dl.prefetch_factor,
        use_liger_kernel=t.kernels == "liger",
    )
    if t.compile:
        out |= {"torch_compile": True, "torch_compile_backend": t.compile_backend or "inductor"}
    return out


def _distributed(cfg: dict[str, Any], *, device: str, world_size: int) -> dict[str, Any]:
    """The TrainingArguments that make the launch real: backend, fsdp, deepspeed."""
    kind = cfg.get("distributed_type", "NO")
    extra: dict[str, Any] = {}
    if kind in ("MULTI_GPU", "FSDP") and world_size > 1:
        extra["ddp_backend"] = "gloo" if device == "cpu" else "nccl"
    if kind == "FSDP":
        fsdp = fsdp_trainer_config(cfg.get("fsdp_config", {}))
        extra["fsdp"] = True
        extra["fsdp_config"] = fsdp
        if fsdp.get("activation_checkpointing"):
            # FSDP-native checkpointing after wrapping replaces the Trainer's (a redundant all-gather otherwise)
            extra["activation_checkpointing"] = False
            extra["activation_checkpointing_kwargs"] = None
    if kind == "DEEPSPEED":
        extra["deepspeed"] = deepspeed_trainer_config(cfg.get("deepspeed_config", {}))
    return extra


def fsdp_trainer_config(fsdp: dict[str, Any]) -> dict[str, Any]:
    """accelerate's fsdp_config block (fsdp_ keys) → TrainingArguments.fsdp_config."""
    out: dict[str, Any] = {k.removeprefix("fsdp_"): v for k, v in fsdp.items()}
    if isinstance(out.get("transformer_layer_cls_to_wrap"), str):
        out["transformer_layer_cls_to_wrap"] = out["transformer_layer_cls_to_wrap"].split(",")
    out["cpu_offload"] = bool(out.pop("offload_params", False))
    if out.get("auto_wrap_policy") == "NO_WRAP":
        out.pop("min_num_params", None)
    if "backward_prefetch" in out:
        out["backward_prefetch"] = str(out["backward_prefetch"]).lower()
    return out


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


def checkpointing_owner(trainer: dict[str, Any]) -> str | None:
    """Who checkpoints activations under these TrainingArguments kwargs: `trainer` (the Trainer turns on the
    model's gradient checkpointing), `fsdp` (accelerate wraps the layers after sharding, and the Trainer's is off:
    `_distributed`), or None. One owner, never both: the worker's k-bit preparation asks the Plan, not the recipe."""
    if trainer.get("activation_checkpointing"):
        return "trainer"
    if (trainer.get("fsdp_config") or {}).get("activation_checkpointing"):
        return "fsdp"
    return None
