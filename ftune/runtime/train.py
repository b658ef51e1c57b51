"""The HF Trainer, or TRL's for a preference objective, configured by the Plan (`plan.trainer`,
`plan.config_class`, `plan.trainer_class`). ftune writes no training loop and no loss of its own."""

from __future__ import annotations

import importlib
import math
from contextlib import ExitStack, contextmanager
from functools import partial

from ftune.errors import FtuneError
from ftune.plan.evaluation import with_perplexity
from ftune.recipe.objectives import FAMILIES, TRL_INSTALL, registered


def _import(path: str):
    """A class the Plan names; only the classes of the registered objectives (`ftune.recipe.objectives`, plugins'
    included: a plan is never code)."""
    objectives = registered().values()
    known = {o.config_path for o in objectives} | {o.trainer_path for o in objectives}
    if path not in known:
        raise FtuneError(f"plan names an unknown trainer class {path!r}", hint="recompile the plan with this ftune")
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as err:
        raise FtuneError(f"{path} is not importable: {err}", hint=TRL_INSTALL) from err


def trainer_class(plan):
    """The Plan's trainer class, writing a whole model's checkpoints in the model's own parameter names.

    transformers 5.23 saves a checkpoint with `save_pretrained`, in the layout the family was published in (LLaVA's
    `model.language_model.x` as `language_model.model.x`), but resumes it (and loads the best one) with
    `load_state_dict(strict=False)` in the model's names: for a family whose layout it converts, nothing would load
    and the run would go on from the base, silently. final/ keeps the published layout (what `from_pretrained` and
    the hub expect); a checkpoint is for resuming (from_pretrained reads either)."""
    base = _import(plan.trainer_class)

    from transformers import PreTrainedModel

    class OwnNamesCheckpoints(base):
        def _save_checkpoint(self, model, trial):
            with ExitStack() as stack:
                # a whole transformers model: not a peft wrapper, nor FSDP1's wrapper (whose attributes forward to
                # the model, but whose class has no save_pretrained: accelerate saves its state dict itself)
                if isinstance(self.model, PreTrainedModel):
                    stack.enter_context(_own_names_on_save(self.model))
                return super()._save_checkpoint(model, trial)

    OwnNamesCheckpoints.__name__ = OwnNamesCheckpoints.__qualname__ = base.__name__
    return OwnNamesCheckpoints


@contextmanager
def _own_names_on_save(model):
    """`model.save_pretrained` writing the model's own names for the duration (`save_original_format=False`)."""
    model.save_pretrained = partial(type(model).save_pretrained, model, save_original_format=False)
    try:
        yield
    finally:
        del model.save_pretrained


def training_arguments(plan, **replace):
    """`config_class(**plan.trainer)` (TrainingArguments or TRL's subclass): the compiled kwargs unchanged
    (`replace` only for `ftune eval`)."""
    layout = {}
    if plan.parallelism is not None and plan.parallelism.total > 1 and "parallelism_config" not in replace:
        from accelerate.parallelism_config import ParallelismConfig

        layout = {"parallelism_config": ParallelismConfig(**plan.parallelism.accelerate_kwargs())}
    return _import(plan.config_class)(**(plan.trainer | layout | replace))


def eval_arguments(plan, output_dir=None):
    """The run's TrainingArguments for evaluation alone, in this one process (`ftune eval`): nothing saved or
    reported, and no process group (a distributed run's model is evaluated gathered, from final/)."""
    from ftune.plan.trainer import DISTRIBUTED_KEYS

    alone = plan.model_copy(update={"trainer": {k: v for k, v in plan.trainer.items() if k not in DISTRIBUTED_KEYS}})
    return training_arguments(alone, output_dir=str(output_dir or plan.run.eval_scratch), report_to="none",
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


def build_trainer(plan, model, tokenizer, bundle, args, callbacks: list, ref_model=None):
    """The trainer for the Plan's objective, built by its family's builder (`Family.trainer`, `Plan.family`).
    `ref_model`: a preference objective's reference model when it is not the one TRL derives (`ftune eval` of a
    full model: the base the run started from)."""
    module, _, name = FAMILIES[plan.family].trainer.partition(":")
    builder = getattr(importlib.import_module(module), name)
    return builder(plan, trainer_class(plan), model, tokenizer, bundle, args, callbacks, ref_model)


def sft_trainer(plan, Trainer, model, tokenizer, bundle, args, callbacks: list, ref_model=None):
    """The sft family's trainer: the objective's Trainer class (transformers' own, or a plugin's subclass) with
    perplexity in its logs and activation offloading."""
    from transformers import PrinterCallback

    r = plan.recipe
    offload = plan.recipe.train.activation_offloading

    class FtuneTrainer(Trainer):
        def log(self, logs, start_time=None):
            super().log(with_perplexity(logs, plan.recipe), start_time)

        def training_step(self, *args, **kwargs):
            if not offload:
                return super().training_step(*args, **kwargs)
            import torch

            # tensors saved for backward go to host memory in forward and come back in backward
            with torch.autograd.graph.save_on_cpu(pin_memory=plan.device == "cuda"):
                return super().training_step(*args, **kwargs)

    cbs = [*callbacks, *_early_stopping(plan, args)]
    trainer = FtuneTrainer(
        model=model,
        args=args,
        train_dataset=bundle.train,
        eval_dataset=bundle.eval,
        data_collator=bundle.collator,
        processing_class=tokenizer,
        compute_metrics=classification_metrics if r.model.task == "sequence-classification" else None,
        callbacks=cbs,
    )
    trainer.remove_callback(PrinterCallback)  # ftune's own progress bar and metrics.jsonl replace raw dict prints
    return trainer


def _early_stopping(plan, args) -> list:
    from transformers import EarlyStoppingCallback

    es = plan.recipe.train.early_stopping
    if es is None or args.eval_strategy == "no":
        return []
    return [EarlyStoppingCallback(early_stopping_patience=es.patience, early_stopping_threshold=es.threshold)]


def preference_trainer(plan, trainer_class, model, tokenizer, bundle, args, callbacks: list, ref_model=None):
    """TRL's trainer for `train.objective` on the model ftune loaded and adapted; TRL computes the loss.

    With a PEFT adapter TRL adds a frozen copy of it named `ref` as the reference. A fresh adapter's copy equals
    the base, so it is dropped and TRL scores the reference with the adapter disabled (no second set of weights);
    a continued adapter (`plan.model_load.adapter`) keeps it: the reference is the policy it starts from (the
    save stage leaves it out of final/). Full fine-tuning: TRL loads a frozen copy."""
    from transformers import PrinterCallback

    from ftune.runtime.precision import set_mixed_precision_policy
    from ftune.runtime.vision_trl import is_processor, preference_collator

    class PreferenceTrainer(trainer_class):
        def create_accelerator_and_postprocess(self):
            super().create_accelerator_and_postprocess()
            set_mixed_precision_policy(self.accelerator, plan)  # before TRL's reference or the policy is wrapped

    images = {}
    if is_processor(tokenizer):  # vision-preference rows: TRL's vision collator on the opened images
        images["data_collator"] = preference_collator(tokenizer, plan.recipe.data.images, args.max_length)
    trainer = PreferenceTrainer(
        model=model,
        args=args,
        train_dataset=bundle.train,
        eval_dataset=bundle.eval,
        processing_class=tokenizer,
        **images,
        callbacks=[*callbacks, preference_guard(plan), *_early_stopping(plan, args)],
        **({} if ref_model is None else {"ref_model": ref_model}),
    )
    peft_config = getattr(trainer.model, "peft_config", None)
    if isinstance(peft_config, dict) and "ref" in peft_config and plan.model_load.adapter is None:
        trainer.model.delete_adapter("ref")
        trainer.model.set_adapter("default")
    trainer.remove_callback(PrinterCallback)
    return trainer


STUCK_LOGS = 3
"""Training logs in a row with a reward accuracy of exactly 0 (after the first step) that stop a preference run."""


def preference_guard(plan):
    """Stop a preference run on the silent failures users report (NaN eval losses under FSDP/fp16, rewards that
    never favour the chosen completion) with an error and a suggestion, instead of training on. A non-finite train
    loss is NumericsGuard's (every run has it, ahead of this callback). Every rank sees the same (gathered) logs, so
    every rank stops."""
    from transformers import TrainerCallback

    from ftune.errors import RunError

    objective = plan.recipe.train.objective

    class PreferenceGuard(TrainerCallback):
        def __init__(self) -> None:
            self.zero_runs = 0

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            value = logs.get("eval_loss")
            if isinstance(value, (int, float)) and not math.isfinite(value):
                raise RunError(
                    f"{objective}: eval_loss is {value} at step {state.global_step}; the run stopped instead of "
                    "training on", hint="lower train.learning_rate or train.max_grad_norm; use bf16 rather than "
                    "fp16 (train.mixed_precision, distributed.fsdp.mixed_precision); check the data for empty "
                    "completions")
            acc = logs.get("rewards/accuracies")
            if acc is None or state.global_step <= 1:  # policy == reference at the first step: accuracy is 0
                return
            self.zero_runs = self.zero_runs + 1 if acc == 0.0 else 0
            if self.zero_runs >= STUCK_LOGS:
                raise RunError(
                    f"{objective}: rewards/accuracies has been exactly 0 for {self.zero_runs} logs in a row "
                    f"(step {state.global_step}): the chosen completion never scores above the rejected one",
                    hint="check that chosen and rejected are not swapped or identical, that data.max_seq_length "
                    "and data.max_prompt_length leave the completions, and train.learning_rate")

    return PreferenceGuard()
