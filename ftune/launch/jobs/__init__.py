"""Job specs for the schedulers teams run: one module per target, registered by name (`ftune launch-script TARGET`).

Each target module has `write(request, loaded) -> str` (the spec text) and `SUBMIT` (how to submit it). The recipe
is loaded and checked once for every target (`common.check`), before anything is written.
"""

from __future__ import annotations

import importlib
from types import ModuleType

TARGETS = {
    "slurm": "ftune.launch.jobs.slurm",
    "kubernetes": "ftune.launch.jobs.kubernetes",
    "skypilot": "ftune.launch.jobs.skypilot",
}


def target(name: str) -> ModuleType:
    return importlib.import_module(TARGETS[name])
