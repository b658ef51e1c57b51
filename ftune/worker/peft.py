"""Stage 4: inject the fine-tuning method chosen in `peft.method` (see ftune.methods) and count parameters."""

from __future__ import annotations

from dataclasses import dataclass

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
    module = method_module(recipe.peft.method)
    try:
        if trained_tokens and recipe.peft.method == "lora":
            model = module.inject(model, recipe.peft, recipe.model.task, trained_tokens=trained_tokens)
        else:  # full trains every row; the rules refuse added tokens with the other adapters
            model = module.inject(model, recipe.peft, recipe.model.task)
    except ValueError as err:
        if "target" in str(err).lower() and recipe.peft.method == "lora":
            from ftune.plan.preflight import target_hint

            raise FtuneError(f"peft.target_modules {list(recipe.peft.target_modules)} match no module of the model",
                             hint=target_hint(model)) from err
        raise
    return model, count_parameters(model)
