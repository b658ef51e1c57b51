"""Stage 6: the HF Trainer, configured by the Plan (`plan.trainer`). ftune writes no training loop of its own."""

from __future__ import annotations

import math


def training_arguments(plan, **replace):
    """`TrainingArguments(**plan.trainer)`: the compiled kwargs unchanged (`replace` only for `eval_arguments`)."""
    from transformers import TrainingArguments

    return TrainingArguments(**(plan.trainer | replace))


def eval_arguments(plan, output_dir=None):
    """The run's TrainingArguments for evaluation alone (`ftune eval`): nothing saved, nothing reported."""
    return training_arguments(plan, output_dir=str(output_dir or plan.run.eval_scratch), report_to="none",
                              eval_strategy="no", save_strategy="no", load_best_model_at_end=False)


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

    offload = plan.recipe.train.activation_offloading

    class FtuneTrainer(Trainer):
        def log(self, logs, start_time=None):
            if "eval_loss" in logs and plan.recipe.model.task == "causal-lm":
                logs["eval_perplexity"] = math.exp(min(logs["eval_loss"], 50.0))
            super().log(logs, start_time)

        def training_step(self, *args, **kwargs):
            if not offload:
                return super().training_step(*args, **kwargs)
            import torch

            # tensors saved for backward go to host memory in forward and come back in backward
            with torch.autograd.graph.save_on_cpu(pin_memory=plan.device == "cuda"):
                return super().training_step(*args, **kwargs)

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
