"""Stage 4: inject the fine-tuning method chosen in `peft.method` (see ftune.methods) and count parameters."""

from __future__ import annotations

import re
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


def _target_error(model, cfg) -> FtuneError:
    from ftune.worker.model import linear_layer_names

    names = linear_layer_names(model)
    return FtuneError(
        f"peft.target_modules {list(cfg.target_modules)} match no module of the model",
        hint=f"linear layers in this model: {', '.join(names)} (or use `peft.target_modules=all-linear`)",
    )


def target_problems(model, recipe) -> list[tuple[str, str, str]]:
    """(path, message, hint) when LoRA target_modules match nothing; checked on the meta model before launch."""
    cfg = recipe.peft
    if cfg.method != "lora" or cfg.target_modules == "all-linear":
        return []
    names = [n for n, _ in model.named_modules()]
    for target in cfg.target_modules:
        if any(n == target or n.endswith("." + target) or re.fullmatch(target, n) for n in names):
            return []
    err = _target_error(model, cfg)
    return [("peft.target_modules", err.message.partition(": ")[2] or err.message, err.hint)]


def apply_method(model, plan):
    """Inject the recipe's method; the seed is set first so adapter initialisation is reproducible."""
    from transformers import set_seed

    recipe = plan.recipe
    set_seed(recipe.train.seed)
    module = method_module(recipe.peft.method)
    try:
        model = module.inject(model, recipe.peft, recipe.model.task)
    except ValueError as err:
        if "target" in str(err).lower() and recipe.peft.method == "lora":
            raise _target_error(model, recipe.peft) from err
        raise
    return model, count_parameters(model)
