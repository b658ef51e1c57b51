"""Stopping a worker cleanly: SIGTERM (preemption) and non-finite numbers.

SIGTERM while training asks for a checkpoint at the current step, then the worker exits 143 (a rerun
resumes from it); before training starts there is nothing to save, so the worker exits at once. After
training, the run is finished first (final/ is the quickest consistent state). A non-finite loss or
gradient norm stops training (exit 4) before anything non-finite is saved.
"""

from __future__ import annotations

import math
import signal

from ftune.errors import EXIT_NONFINITE, EXIT_TERMINATED, FtuneError
from ftune.runtime import reward_pool

ADVICE = ("lower train.learning_rate, set train.max_grad_norm (e.g. 1.0), add warmup (train.warmup_steps), "
          "or use bf16 instead of fp16; the run dir keeps every complete checkpoint, none of them non-finite")


class Terminated(BaseException):
    """SIGTERM before training started (nothing to save). A BaseException, like KeyboardInterrupt, so no
    library's `except Exception` swallows it."""


class NonFinite(FtuneError):
    exit_code = EXIT_NONFINITE


def nonfinite(where: str, step: int, value: float | None = None) -> NonFinite:
    shown = "" if value is None else f" ({value})"
    return NonFinite(f"training stopped at step {step}: {where} is not finite{shown}", hint=ADVICE)


def terminated_error(step: int | None, checkpoint: str | None) -> FtuneError:
    if checkpoint is None and not step:
        return FtuneError("stopped by SIGTERM before training started; nothing was trained",
                          hint="rerun the same command to start", exit_code=EXIT_TERMINATED)
    if checkpoint is None:  # steps ran, but this step's checkpoint did not complete within the grace
        return FtuneError(f"stopped by SIGTERM at step {step}; no complete checkpoint of this step was saved",
                          hint="rerun the same command: it resumes from the last complete checkpoint in the run "
                               "dir (checkpoint.resume: auto), or starts over when there is none",
                          exit_code=EXIT_TERMINATED)
    return FtuneError(f"stopped by SIGTERM at step {step}; saved a complete checkpoint: {checkpoint}",
                      hint="rerun the same command to resume from it (checkpoint.resume: auto)",
                      exit_code=EXIT_TERMINATED)


def is_finite(value) -> bool:
    return not isinstance(value, (int, float)) or math.isfinite(value)


class StopRequest:
    """The worker's SIGTERM state: `phase` is "setup", "training" or "finishing"."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.phase = "setup"

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        self.signum = signum
        if self.phase == "setup":
            raise Terminated()
        if self.phase == "training":  # a reward scoring now is abandoned: its step ends, checkpointed, within the grace
            reward_pool.INTERRUPT.set()

    @property
    def requested(self) -> bool:
        return self.signum is not None


STOP = StopRequest()
