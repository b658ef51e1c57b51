"""Launch a compiled Plan: write the run dir, then `accelerate launch` the worker (one path for 1..N processes)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path

from ftune.errors import EXIT_INTERRUPTED, FtuneError, RunError
from ftune.launch.rundir import write_inputs
from ftune.rundir import RunDir

# Inherited by the workers; never carries secrets (those stay in the user's environment).
WORKER_ENV = {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "ACCELERATE_DISABLE_RICH": "1"}


def _prepare_run_dir(plan) -> Path | None:
    """Create or reuse the run dir; returns the topmost folder this call created (so a failed start can remove it)."""
    run = plan.run
    created = None
    probe = run.root
    while not probe.exists():
        created, probe = probe, probe.parent
    if plan.recipe.output.overwrite and not plan.resume_from:
        for target in run.outputs():
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    run.root.mkdir(parents=True, exist_ok=True)
    return created


def _worker_error(run: RunDir) -> FtuneError | None:
    path = run.error
    if not path.is_file():
        return None
    info = json.loads(path.read_text())
    if info.get("kind") == "user":
        return FtuneError(info["message"], hint=info.get("hint"), exit_code=info.get("exit_code"))
    return RunError(f"the run failed: {info['message']}",
                    hint=f"traceback in {path}; rerun with --debug to see it live")


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _wait_after_interrupt(proc: subprocess.Popen, grace: float = 60.0) -> None:
    """Ctrl-C reached the whole process group: the workers stop between steps (complete checkpoints stay).
    Give them time to exit cleanly, then kill whatever is left."""
    try:
        proc.wait(timeout=grace)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        proc.kill()
        proc.wait()


def launch(plan, resolved_yaml: str, *, secret_env: Mapping[str, str] = {}, debug: bool = False) -> int:
    """Write the run dir and run the workers. `secret_env`: secrets given on the command line, handed to the workers
    through their environment only (never written to the run dir)."""
    run = plan.run
    created = _prepare_run_dir(plan)
    write_inputs(plan, resolved_yaml)
    env = dict(os.environ, **WORKER_ENV, **plan.launch.env, **secret_env)
    if debug:
        env["FTUNE_DEBUG"] = "1"
    # Same process group as ftune: a kill of ftune's group (a scheduler, a test) also stops the workers.
    # accelerate itself ignores Ctrl-C (it would print its own traceback); the worker re-enables it.
    proc = subprocess.Popen(plan.launch.command, env=env, preexec_fn=_ignore_sigint)
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        _wait_after_interrupt(proc)
        raise FtuneError(
            "interrupted; the run dir keeps every complete checkpoint",
            hint="rerun the same command to continue (checkpoint.resume: auto)",
            exit_code=EXIT_INTERRUPTED,
        ) from None
    if code == 0:
        return 0
    err = _worker_error(run) or RunError(
        f"accelerate launch exited with code {code}", hint=f"see the output above; the run dir is {run.root}"
    )
    if created is not None and not run.has_started():
        shutil.rmtree(created, ignore_errors=True)  # nothing trained: leave nothing half-written behind
    raise err
