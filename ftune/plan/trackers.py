"""Experiment-tracker settings (`output.trackers`) as the environment variables W&B and MLflow read.

Only trackers named in `output.report_to` get variables (a rule refuses settings for the others), so a
recipe sends nothing anywhere unless it asks. The variables go to the workers through `plan.launch.env`.
"""

from __future__ import annotations

import json

from ftune.recipe.schema import Recipe


def tracker_env(recipe: Recipe) -> dict[str, str]:
    """WANDB_* / MLFLOW_* variables for the trackers the recipe reports to."""
    trackers, on = recipe.output.trackers, set(recipe.output.report_to)
    env: dict[str, str] = {}
    if trackers is None:
        return env
    w, m = trackers.wandb, trackers.mlflow
    if w is not None and "wandb" in on:
        values = {"WANDB_PROJECT": w.project, "WANDB_ENTITY": w.entity, "WANDB_RUN_GROUP": w.group,
                  "WANDB_MODE": w.mode, "WANDB_TAGS": ",".join(w.tags) if w.tags else None}
        env |= {k: v for k, v in values.items() if v}
    if m is not None and "mlflow" in on:
        values = {"MLFLOW_TRACKING_URI": m.tracking_uri, "MLFLOW_EXPERIMENT_NAME": m.experiment,
                  "MLFLOW_TAGS": json.dumps(m.tags, sort_keys=True) if m.tags else None}
        env |= {k: v for k, v in values.items() if v}
    return env
