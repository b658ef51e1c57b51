"""A plan whose `model.path` is a GGUF file, before a command reads its model: the conversion into the cached folder
the compiler chose (`ftune.plan.gguf`), in the parent, once, and the model checks that wait for that folder."""

from __future__ import annotations


def materialize(plan, loaded, log=print) -> list[str]:
    """Before a command reads the model of a plan whose model.path is a GGUF (`ftune run`, `data`, `eval`): convert
    it into its cached folder unless the cache has it, then run the model-structure checks the compiler left for
    when that folder exists. Refuses (`loaded.error`) what they find; returns the warnings."""
    if plan.model_load.gguf is None:
        return []
    from ftune.gguf.convert import ensure
    from ftune.plan.checks.preflight import config_is_local, problems

    checked = config_is_local(plan.recipe)  # converted before: the compiler checked its structure
    ensure(plan.model_load.gguf.model_dump(), log=log)
    if checked:
        return []
    found = problems(plan.recipe, plan.device)  # the converted model's structure, now that it exists
    if errors := [p for p in found if p.severity == "error"]:
        raise loaded.error(errors)
    return [p.render() for p in loaded.error(found).problems]
