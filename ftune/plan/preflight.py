"""Checks that need the model's structure (not its weights), run on the meta device before launch.

LoRA targets that match nothing, FSDP wrap classes missing from the model, and 4-bit shapes the CPU
kernels can't run are reported as located recipe errors, before the run dir is written.
"""

from __future__ import annotations

from ftune.errors import RecipeError
from ftune.plan.compile import _problem


def preflight(loaded, plan) -> None:
    from ftune.worker.model import build_meta_model
    from ftune.worker.peft import target_problems

    recipe = plan.recipe
    model = build_meta_model(recipe)
    found = list(target_problems(model, recipe))
    if recipe.distributed.strategy == "fsdp":
        from ftune.worker.distributed import check_wrap_classes

        found += check_wrap_classes(recipe, model)
    if recipe.quantization is not None:
        from ftune.worker import quantize

        found += quantize.check_model_config(recipe, model, plan.device)
    if found:
        raise RecipeError([_problem(loaded, path, msg, hint) for path, msg, hint in found], file=loaded.file)
