"""Whether a checkpoint can be resumed by this recipe: the keys its weights and data order depend on, compared with
the plan.json of the run that wrote it (the compiler's resume check, beside `plan.environment`'s machine checks)."""

from __future__ import annotations

from pathlib import Path

from ftune.errors import Problem
from ftune.recipe.schema import Recipe
from ftune.rundir import RunDir


# What a checkpoint's weights and data order depend on: resuming across a change of any of these would load
# tensors of other shapes (or into other modules), or continue another dataset's order.
RESUME_KEYS = ("model.path", "model.task", "peft.method", "peft.r", "peft.target_modules", "data.train")


def _dig(data: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def _same(before, now) -> bool:
    """Equal, where dicts are compared on the keys both have (a field added to the schema since is no change)."""
    if isinstance(before, dict) and isinstance(now, dict):
        return all(_same(before[k], now[k]) for k in before.keys() & now.keys())
    if isinstance(before, list) and isinstance(now, list):
        return len(before) == len(now) and all(_same(a, b) for a, b in zip(before, now))
    return before == now


def resume_compatible(recipe: Recipe, checkpoint: Path) -> list[Problem]:
    """Resuming `checkpoint` with this recipe restores what it saved: compared with the plan.json of the run
    that wrote it (`<run>/checkpoints/checkpoint-N`)."""
    import json

    previous = checkpoint.parent.parent / RunDir(checkpoint).plan.name
    try:
        old = json.loads(previous.read_text())["recipe"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    new = recipe.model_dump(mode="json")
    found = []
    for key in RESUME_KEYS:
        before, now = _dig(old, key), _dig(new, key)
        if not _same(before, now):
            found.append(Problem.at(key, f"the checkpoint to resume ({checkpoint}) was trained with {key} = "
                                    f"{json.dumps(before)}, this recipe says {json.dumps(now)}: its weights "
                                    "don't fit this run",
                                    "set `output.overwrite=true` to start over, or choose a new output.dir"))
    return found
