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
    if recipe.train.precision == "fp8":  # before an adapter wraps the layers (ftune.fp8; refused off FP8 GPUs)
        from ftune import fp8

        fp8.convert(model)
    if plan.model_load.adapter is not None:
        model = continue_adapter(model, plan)
        without_autograd(model)
        return model, count_parameters(model)
    module = method_module(recipe.peft.method)
    try:
        if trained_tokens and recipe.peft.adapts_linear_layers:
            model = module.inject(model, recipe.peft, recipe.model.task, trained_tokens=trained_tokens)
        else:  # full trains every row; the rules refuse added tokens with the other adapters
            model = module.inject(model, recipe.peft, recipe.model.task)
    except ValueError as err:
        if "target" in str(err).lower() and recipe.peft.adapts_linear_layers:
            from ftune.plan.checks.preflight import target_hint

            raise FtuneError(f"peft.target_modules {list(recipe.peft.target_modules)} match no module of the model",
                             hint=target_hint(model)) from err
        raise
    without_autograd(model)
    return model, count_parameters(model)


def without_autograd(model) -> list[str]:
    """A vision-language model's frozen vision tower (nothing of it trains) runs under `torch.no_grad`: its
    outermost modules (a tower that holds its projector, as Qwen's does, the modules beside it) switch autograd off
    for their call, and the tower's patch embeddings take no input-grad hook. transformers' checkpointing
    (`enable_input_require_grads`) hooks every sub-model's input embeddings to require grad, the vision tower's
    too, so without this backward ran through the frozen tower and checkpointing recomputed each of its layers.
    Returns the modules switched (none for a text model or a tower that trains)."""
    from ftune.models.vision_parts import called, is_vision_language, outermost, part_of

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    kind = getattr(getattr(base, "config", None), "model_type", None)
    if not is_vision_language(kind):
        return []
    params = dict(base.named_parameters())
    if any(p.requires_grad for name, p in params.items() if part_of(name, kind) == "vision"):
        return []
    modules = dict(base.named_modules())
    tops = outermost(list(params), kind, {"vision"})
    chosen = called(modules, tops)
    for name in chosen:
        module = modules[name]
        module.register_forward_pre_hook(_autograd_off)
        module.register_forward_hook(_autograd_back, always_call=True)
    inside = {id(m) for top in tops for m in modules[top].modules()}
    for module in modules.values():  # the tower's own embeddings: no input-grad hook (transformers skips None)
        embeddings = getattr(module, "get_input_embeddings", None)
        try:
            found = embeddings() if module is not base and callable(embeddings) else None
        except (NotImplementedError, AttributeError):
            continue
        if found is not None and id(found) in inside:
            module.get_input_embeddings = _no_embeddings
    return chosen


def _autograd_off(module, args) -> None:
    import torch

    module._ftune_grad_enabled = torch.is_grad_enabled()
    torch.set_grad_enabled(False)


def _autograd_back(module, args, output) -> None:
    import torch

    torch.set_grad_enabled(module.__dict__.pop("_ftune_grad_enabled", True))


def _no_embeddings():
    return None


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
