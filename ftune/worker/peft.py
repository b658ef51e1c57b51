"""Inject the fine-tuning method chosen in `peft.method` (see ftune.methods), or load the saved adapter
the plan continues (`plan.model_load.adapter`) trainable, and count parameters."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ftune.adapter import unplaced_lora_tensors
from ftune.errors import FtuneError
from ftune.methods import method_module


@dataclass(frozen=True)
class ParamCounts:
    trainable: int
    total: int

    @property
    def percent(self) -> float:
        return 100.0 * self.trainable / max(self.total, 1)


def count_parameters(model) -> ParamCounts:
    """Trainable and total parameters, computed exactly as peft's `get_nb_trainable_parameters`."""
    if hasattr(model, "get_nb_trainable_parameters"):
        trainable, total = model.get_nb_trainable_parameters()
        return ParamCounts(trainable, total)
    trainable = total = 0
    for _, p in model.named_parameters():
        n = p.numel()
        if p.__class__.__name__ == "Params4bit":
            n *= 2 * (p.element_size() if hasattr(p, "element_size") else 1)
        total += n
        trainable += n if p.requires_grad else 0
    return ParamCounts(trainable, total)


def apply_method(model, plan, trained_tokens: list[int] | None = None):
    """Inject the recipe's method; the seed is set first so adapter initialisation is reproducible.
    `trained_tokens`: ids whose embedding rows train (model.add_tokens, model.special_tokens)."""
    from transformers import set_seed

    recipe = plan.recipe
    set_seed(recipe.train.seed)
    if plan.model_load.adapter is not None:
        model = continue_adapter(model, plan)
        return model, count_parameters(model)
    module = method_module(recipe.peft.method)
    try:
        if trained_tokens and recipe.peft.adapts_linear_layers:
            model = module.inject(model, recipe.peft, recipe.model.task, trained_tokens=trained_tokens)
        else:  # full trains every row; the rules refuse added tokens with the other adapters
            model = module.inject(model, recipe.peft, recipe.model.task)
    except ValueError as err:
        if "target" in str(err).lower() and recipe.peft.adapts_linear_layers:
            from ftune.plan.preflight import target_hint

            raise FtuneError(f"peft.target_modules {list(recipe.peft.target_modules)} match no module of the model",
                             hint=target_hint(model)) from err
        raise
    return model, count_parameters(model)


def continue_adapter(model, plan):
    """The saved adapter `plan.model_load.adapter`, loaded trainable over `model` (its base, quantized when the
    recipe says so). The compiler checked it against the recipe; its config names the resolved base, so the
    final/ adapter saved from it does too, and the recipe's dropout (a training setting) applies."""
    from peft import PeftConfig, PeftModel

    folder = plan.model_load.adapter
    config = PeftConfig.from_pretrained(folder)
    config.base_model_name_or_path = plan.model_load.path
    if hasattr(config, "lora_dropout"):
        config.lora_dropout = plan.recipe.peft.dropout
        config.init_lora_weights = True  # the weights are loaded: an init such as pissa would rewrite the base
    hint = "the base changed since the adapter was trained; point model.path at a base model to train a new adapter"
    try:
        model = PeftModel.from_pretrained(model, folder, is_trainable=True, config=config)
    except RuntimeError as err:
        if "size mismatch" not in str(err):
            raise
        first = next(line.strip() for line in str(err).splitlines() if "size mismatch" in line)
        raise FtuneError(f"the adapter {folder} does not fit its base {plan.model_load.path}: {first}",
                         hint=hint) from None
    homeless = unplaced_lora_tensors(model, Path(folder))
    if homeless:  # peft only warns: those layers would train on from a fresh init, silently
        raise FtuneError(f"the adapter {folder} does not fit its base {plan.model_load.path}: {len(homeless)} "
                         f"adapter tensors have no place in it, e.g. {homeless[0]}", hint=hint)
    return model
