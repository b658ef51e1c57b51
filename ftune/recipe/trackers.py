"""The experiment trackers `output.report_to` can name: the ones transformers' Trainer reports to, each with the
modules it needs (as transformers checks them) and the line that installs them. The schema takes its names from
here, the compiler's package check its modules and install line (docs/trackers.md: offline modes)."""

from __future__ import annotations

from typing import NamedTuple


class Tracker(NamedTuple):
    modules: tuple[str, ...]
    install: str


TRACKERS: dict[str, Tracker] = {
    "tensorboard": Tracker(("tensorboard",), "pip install tensorboard"),
    "wandb": Tracker(("wandb",), "pip install wandb"),
    "mlflow": Tracker(("mlflow",), 'pip install mlflow-skinny   (or "ftune[mlflow]")'),
    "trackio": Tracker(("trackio",), "pip install trackio"),
    "comet_ml": Tracker(("comet_ml",), "pip install comet-ml"),
    "neptune": Tracker(("neptune",), "pip install neptune"),
    "clearml": Tracker(("clearml",), "pip install clearml"),
    "dvclive": Tracker(("dvclive",), "pip install dvclive"),
    "swanlab": Tracker(("swanlab",), "pip install swanlab"),
    "codecarbon": Tracker(("codecarbon",), "pip install codecarbon"),
    "azure_ml": Tracker(("azureml.core",), "pip install azureml-core"),
    "dagshub": Tracker(("dagshub", "mlflow"), "pip install dagshub mlflow-skinny"),
    "flyte": Tracker(("flytekit",), "pip install flytekit"),
}
NAMES = ("none", *TRACKERS)
