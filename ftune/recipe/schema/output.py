"""`checkpoint:` and `output:` where results go: checkpoints and resume, the run dir, experiment trackers."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ftune.recipe.schema.base import Section
from ftune.recipe.trackers import NAMES as TRACKER_NAMES


class CheckpointSection(Section):
    strategy: Literal["no", "steps", "epoch"] = "steps"
    """When to save checkpoints."""
    steps: int = Field(500, gt=0)
    """Save every N steps (strategy: steps)."""
    keep: int | None = Field(3, ge=1)
    """Keep at most N checkpoints (null keeps all)."""
    resume: Literal["auto"] | bool | str = "auto"
    """`auto`: continue from the latest complete checkpoint in the run dir; a checkpoint path; or false."""
    load_best: bool = False
    """Load the best checkpoint (by early_stopping.metric or eval_loss) at the end."""
    per_epoch: int | None = Field(None, ge=1)
    """Save N checkpoints per epoch, evenly (instead of `strategy`/`steps`; needs `train.epochs`)."""


class WandbSettings(Section):
    """Weights & Biases settings, passed as its environment variables (WANDB_*); used only when report_to has wandb."""

    project: str | None = None
    """WANDB_PROJECT."""
    entity: str | None = None
    """WANDB_ENTITY: the team or user that owns the project."""
    run_name: str | None = None
    """The run's name (TrainingArguments.run_name, shared with MLflow); default: the recipe's name."""
    tags: list[str] | None = None
    """WANDB_TAGS."""
    group: str | None = None
    """WANDB_RUN_GROUP."""
    mode: Literal["online", "offline"] | None = None
    """WANDB_MODE: `offline` keeps the run on this machine (sync it later)."""


class MlflowSettings(Section):
    """MLflow settings, passed as its environment variables (MLFLOW_*); used only when report_to has mlflow."""

    tracking_uri: str | None = None
    """MLFLOW_TRACKING_URI: a server URL or a local folder (file:...); default: ./mlruns."""
    experiment: str | None = None
    """MLFLOW_EXPERIMENT_NAME."""
    run_name: str | None = None
    """The run's name (TrainingArguments.run_name, shared with W&B); default: the recipe's name."""
    tags: dict[str, str] | None = None
    """MLFLOW_TAGS: run tags as name: value."""


class Trackers(Section):
    """Settings of the experiment trackers named in output.report_to."""

    wandb: WandbSettings | None = None
    """Weights & Biases."""
    mlflow: MlflowSettings | None = None
    """MLflow."""


class OutputSection(Section):
    dir: str | None = None
    """Run directory, relative to the working directory; default: runs/<name>."""
    report_to: list[Literal[TRACKER_NAMES]] = Field(default_factory=lambda: ["tensorboard"])  # type: ignore[valid-type]
    """Experiment trackers (the ones transformers reports to; each needs its package, checked before launch);
    metrics.jsonl is always written. Offline modes: docs/trackers.md."""
    overwrite: bool = False
    """Allow starting over in a run dir that holds a finished run."""
    loss_curve: bool = True
    """Write loss_curve.png at the end."""
    report: bool = False
    """Write report.html in the run dir (curves, predictions, recipe, plan: `ftune report`) and refresh it at each
    log, so a live run can be watched from a browser; `ftune report RUN_DIR` writes it for any run."""
    trackers: Trackers | None = None
    """Tracker settings (W&B project/entity/run name/tags, MLflow experiment/tags); nothing is sent unless the
    tracker is also in report_to."""
