"""Test instrumentation: hold the worker at a chosen step, so a test signals a run that is provably mid-run.

Off unless the environment asks for it (`FTUNE_HOLD_AT_STEP=N` with `FTUNE_HOLD_DIR=DIR`, set only by the tests
that interrupt or kill a run). Once step N is done (its logs written, its checkpoint saved and marked), before
step N+1 starts, each rank writes `DIR/held.rank<R>` (the step) and waits until `DIR/release` exists or a SIGTERM
has been asked for (worker/stop.py); SIGINT and SIGKILL end the wait as they end any other. A test waits for the
held file, signals, and knows where the run is: no CPU is fast enough to finish it first.
`FTUNE_STEP_DELAY=SECONDS` sleeps after every step: the same tests run with the worker slowed down.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ftune.worker.stop import STOP

ENV_STEP = "FTUNE_HOLD_AT_STEP"
ENV_DIR = "FTUNE_HOLD_DIR"
ENV_DELAY = "FTUNE_STEP_DELAY"
RELEASE = "release"


def enabled() -> bool:
    return bool(os.environ.get(ENV_STEP) or os.environ.get(ENV_DELAY))


def held_file(folder: Path, rank: int) -> Path:
    return Path(folder) / f"held.rank{rank}"


def callback(rank: int):
    """A TrainerCallback that holds at FTUNE_HOLD_AT_STEP and sleeps FTUNE_STEP_DELAY after each step."""
    from transformers import TrainerCallback

    step = int(os.environ[ENV_STEP]) if os.environ.get(ENV_STEP) else None
    folder = Path(os.environ[ENV_DIR]) if step is not None else None
    delay = float(os.environ.get(ENV_DELAY) or 0)

    class HoldAtStep(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if step is None or state.global_step != step:
                return
            folder.mkdir(parents=True, exist_ok=True)
            held = held_file(folder, rank)
            tmp = folder / f".{held.name}.tmp"  # one per rank: the ranks share the folder
            tmp.write_text(f"{state.global_step}\n")
            tmp.replace(held)  # appears whole: the test reads the step from it
            while not (folder / RELEASE).exists() and not STOP.requested:
                time.sleep(0.01)

        def on_step_end(self, args, state, control, **kwargs):
            if delay:
                time.sleep(delay)

    return HoldAtStep()
