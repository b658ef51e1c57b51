"""Experiment-tracker settings (`output.trackers`) as the environment variables W&B and MLflow read.

Only trackers named in `output.report_to` get variables (a rule refuses settings for the others), so a
recipe sends nothing anywhere unless it asks; MLflow with a local file store also gets MLFLOW_ALLOW_FILE_STORE.
The variables go to the workers through `plan.launch.env`.
"""

from __future__ import annotations

import json

from ftune.recipe.schema import Recipe


def tracker_env(recipe: Recipe) -> dict[str, str]:
    """WANDB_* / MLFLOW_* variables for the trackers the recipe reports to."""
    trackers, on = recipe.output.trackers, set(recipe.output.report_to)
    env: dict[str, str] = {}
    if "mlflow" in on and local_mlflow_store(trackers.mlflow.tracking_uri if trackers and trackers.mlflow else None):
        env["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 refuses its file store at the first log otherwise
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


def local_mlflow_store(uri: str | None) -> bool:
    """MLflow's file store: a `file:` URI, a path, or none given (MLflow's default, ./mlruns). MLflow 3 keeps it
    in maintenance mode and raises at the run's first log unless MLFLOW_ALLOW_FILE_STORE is set; a recipe that
    names one (or takes the default) asked for it, so the plan sets the variable for the workers."""
    return uri is None or uri.startswith(("file:", "/", ".", "~"))
