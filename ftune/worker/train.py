"""Stage 6: the HF Trainer, configured from the Plan. ftune writes no training loop of its own."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

from ftune.errors import FtuneError

# Optimizers that need an optional package: name prefix -> (import name, pip spec)
OPTIONAL_OPTIMIZERS = {
    "galore": ("galore_torch", "galore-torch"),
    "lomo": ("lomo_optim", "lomo-optim"),
    "adalomo": ("lomo_optim", "lomo-optim"),
    "apollo": ("apollo_torch", "apollo-torch"),
}


def check_optimizer(name: str) -> None:
    """A clear error for optimizers whose optional package is missing (instead of a deep ImportError)."""
    from transformers.training_args import OptimizerNames

    valid = [o.value for o in OptimizerNames]
    if name not in valid:
        import difflib

        close = difflib.get_close_matches(name, valid, n=3)
        raise FtuneError(
            f"train.optimizer: unknown optimizer {name!r}",
            hint=(f"did you mean {', '.join(repr(c) for c in close)}? " if close else "")
            + "any transformers `optim` name works, e.g. adamw_torch, adamw_8bit, paged_adamw_8bit",
        )
    for prefix, (module, pip_name) in OPTIONAL_OPTIMIZERS.items():
        if name.startswith(prefix) and importlib.util.find_spec(module) is None:
            raise FtuneError(
                f"train.optimizer: {name} needs the optional package {pip_name}, which is not installed",
                hint=f"pip install {pip_name}   (or pick another optimizer, e.g. adamw_torch)",
            )


def training_arguments(plan, extra: dict | None = None):
    """TrainingArguments from the recipe; `extra` comes from the distributed stage (fsdp, ddp, use_cpu...)."""
    from transformers import TrainingArguments

    r = plan.recipe
    t, ev, ck = r.train, r.eval, r.checkpoint
    check_optimizer(t.optimizer)
    has_eval = r.data.eval is not None and ev.strategy != "no"
    best_metric = t.early_stopping.metric if t.early_stopping else "eval_loss"
    kwargs = dict(
        output_dir=str(Path(plan.run_dir) / "checkpoints"),
        num_train_epochs=t.epochs if t.epochs is not None else 1.0,
        max_steps=t.max_steps if t.max_steps is not None else -1,
        learning_rate=t.learning_rate,
        lr_scheduler_type=t.lr_scheduler,
        warmup_steps=t.warmup_steps if t.warmup_steps is not None else (t.warmup_ratio or 0.0),
        weight_decay=t.weight_decay,
        per_device_train_batch_size=t.per_device_batch_size,
        per_device_eval_batch_size=ev.batch_size or t.per_device_batch_size,
        gradient_accumulation_steps=t.gradient_accumulation_steps,
        activation_checkpointing=t.gradient_checkpointing,
        activation_checkpointing_kwargs={"use_reentrant": False} if t.gradient_checkpointing else None,
        bf16=plan.mixed_precision == "bf16",
        fp16=plan.mixed_precision == "fp16",
        optim=t.optimizer,
        max_grad_norm=t.max_grad_norm,
        seed=t.seed,
        data_seed=t.seed,
        logging_steps=t.logging_steps,
        logging_first_step=True,
        neftune_noise_alpha=t.neftune_alpha,
        eval_strategy=ev.strategy if has_eval else "no",
        eval_steps=ev.steps,
        eval_on_start=ev.on_start and r.data.eval is not None,
        save_strategy=ck.strategy,
        save_steps=ck.steps,
        save_total_limit=ck.keep,
        load_best_model_at_end=ck.load_best or bool(t.early_stopping),
        metric_for_best_model=best_metric if has_eval else None,
        greater_is_better=None if not has_eval else not best_metric.endswith(("loss", "perplexity")),
        report_to=[x for x in r.output.report_to if x != "none"] or "none",
        log_level=t.log_level,
        log_level_replica=t.log_level_replica,
        disable_tqdm=True,
        include_num_input_tokens_seen="non_padding",
        remove_unused_columns=False,
        use_cpu=plan.device == "cpu",
        dataloader_num_workers=0,
    )
    kwargs.update(extra or {})
    return TrainingArguments(**kwargs)


def classification_metrics(eval_pred) -> dict:
    """Accuracy and macro F1 from logits (the Trainer has already gathered them across processes)."""
    import numpy as np

    logits, labels = eval_pred
    logits = logits[0] if isinstance(logits, tuple) else logits
    preds = np.asarray(logits).argmax(-1)
    labels = np.asarray(labels)
    f1s = []
    for c in np.unique(np.concatenate([labels, preds])):
        tp = np.sum((preds == c) & (labels == c))
        fp = np.sum((preds == c) & (labels != c))
        fn = np.sum((preds != c) & (labels == c))
        f1s.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return {"accuracy": float(np.mean(preds == labels)), "f1": float(np.mean(f1s))}


def build_trainer(plan, model, tokenizer, bundle, args, callbacks: list):
    from transformers import EarlyStoppingCallback, PrinterCallback, Trainer

    class FtuneTrainer(Trainer):
        def log(self, logs, start_time=None):
            if "eval_loss" in logs and plan.recipe.model.task == "causal-lm":
                logs["eval_perplexity"] = math.exp(min(logs["eval_loss"], 50.0))
            super().log(logs, start_time)

    r = plan.recipe
    cbs = list(callbacks)
    if r.train.early_stopping and args.eval_strategy != "no":
        es = r.train.early_stopping
        cbs.append(EarlyStoppingCallback(early_stopping_patience=es.patience,
                                         early_stopping_threshold=es.threshold))
    trainer = FtuneTrainer(
        model=model,
        args=args,
        train_dataset=bundle.train,
        eval_dataset=bundle.eval if args.eval_strategy != "no" or bundle.eval is not None else None,
        data_collator=bundle.collator,
        processing_class=tokenizer,
        compute_metrics=classification_metrics if r.model.task == "sequence-classification" else None,
        callbacks=cbs,
    )
    trainer.remove_callback(PrinterCallback)  # ftune's own progress bar and metrics.jsonl replace raw dict prints
    return trainer
