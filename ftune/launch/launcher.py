"""Launch a compiled Plan: write the run dir, then `accelerate launch` the worker (one path for 1..N processes)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from ftune.errors import EXIT_BUSY, EXIT_INTERRUPTED, FtuneError, Problem, RecipeError, RunError, disk_full
from ftune.launch.lock import claim, describe
from ftune.launch.run_inputs import write_inputs
from ftune.lifecycle import PLAN_DIGEST_ENV, die_with_parent
from ftune.plan.checks.model_files import checkpoint_problem
from ftune.rundir import RunDir, checkpoint_step, is_complete

# Inherited by the workers; never carries secrets (those stay in the user's environment).
WORKER_ENV = {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "ACCELERATE_DISABLE_RICH": "1"}


def _start_over(plan) -> None:
    """`output.overwrite: true`: remove what an earlier run produced (only ftune's names, only in a folder
    holding ftune's marker: `lock.claim` checked it)."""
    run = plan.run
    assert run.is_owned(), run.root
    for target in run.outputs():
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()


def _check_unchanged(plan) -> None:
    """Under the lock: the run dir still says what the plan decided (another run may have finished in between)."""
    run, recipe = plan.run, plan.recipe
    if recipe.output.overwrite:
        return
    chosen = checkpoint_step(Path(plan.resume_from)) if plan.resume_from else -1
    newer = [c for c in run.complete_checkpoints() if checkpoint_step(c) > chosen and checkpoint_problem(c) is None]
    moved = recipe.checkpoint.resume in ("auto", True) and (
        bool(newer) or (plan.resume_from is not None and not is_complete(Path(plan.resume_from))))
    if moved or is_complete(run.final):
        raise FtuneError(f"{run.root} changed while this run was being planned (another run wrote to it)",
                         hint="rerun the same command to plan from what is there now", exit_code=EXIT_BUSY)


def _worker_error(run: RunDir, *, kept: bool) -> FtuneError | None:
    """The worker's error from error.json; `kept`: whether the run dir (and so error.json) stays on disk."""
    path = run.error
    try:
        info = json.loads(path.read_text())
        message = info["message"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if info.get("kind") == "user" and isinstance(info.get("problems"), list):  # a RecipeError: its problems
        try:
            return RecipeError([Problem(message=str(p["message"]), path=str(p.get("path") or ""), hint=p.get("hint"),
                                        severity=str(p.get("severity") or "error")) for p in info["problems"]])
        except (KeyError, TypeError):
            pass
    if info.get("kind") == "user":
        return FtuneError(message, hint=info.get("hint"), exit_code=info.get("exit_code"))
    last = (info.get("traceback") or "").strip().splitlines()[-3:-1]
    where = f" ({last[0].strip()})" if last else ""
    return RunError(f"the run failed: {message}{where}",
                    hint=(f"traceback in {path}; " if kept else "") + "rerun with --debug to see it live")


def _launcher_child() -> None:
    """accelerate's process (own session): it ignores Ctrl-C and SIGTERM (the worker handles them and accelerate
    waits for it; torchrun installs its own handler and forwards), and dies with ftune (so do the workers)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    die_with_parent(signal.SIGKILL)


def _forward(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _wait_after_interrupt(proc: subprocess.Popen, grace: float = 60.0) -> None:
    """Ctrl-C: the workers stop between steps (complete checkpoints stay). Give them time to exit cleanly,
    then kill whatever is left."""
    _forward(proc, signal.SIGINT)
    try:
        proc.wait(timeout=grace)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        _forward(proc, signal.SIGKILL)
        proc.wait()


def launch(plan, resolved_yaml: str, *, secret_env: Mapping[str, str] = {}, debug: bool = False,
           origins: dict[str, str] | None = None, estimate: dict | None = None) -> int:
    """Claim and lock the run dir, write its inputs and run the workers. `secret_env`: secrets given on the command
    line, handed to the workers through their environment only (never written to the run dir)."""
    run = plan.run
    lock, created = claim(run, "run", plan.machine_rank)
    with lock:
        if lock.took_over:
            print(f"ftune: took over the stale lock of {describe(lock.took_over)}: that process is gone",
                  file=sys.stderr)
        if plan.machine_rank == 0:  # node 0 owns the run dir: the others follow what it decided
            _check_unchanged(plan)
        if plan.recipe.output.overwrite and plan.machine_rank == 0:
            _start_over(plan)
        try:
            digest = write_inputs(plan, resolved_yaml, origins, estimate)
        except OSError as exc:
            raise (disk_full(exc, run.root) or exc) from exc
        env = dict(os.environ, **WORKER_ENV, **plan.launch.env, **secret_env, **{PLAN_DIGEST_ENV: digest})
        if debug:
            env["FTUNE_DEBUG"] = "1"
        code = _run_workers(plan.launch.command, env, lock.fd)
        if code == 0:
            return 0
        remove = created is not None and not run.has_started()  # nothing trained: leave nothing half-written
        err = _worker_error(run, kept=not remove) or RunError(
            f"accelerate launch exited with code {code}",
            hint="see the output above" + ("" if remove else f"; the run dir is {run.root}"))
        if remove:
            shutil.rmtree(created, ignore_errors=True)
    raise err


def _run_workers(command: list[str], env: dict, lock_fd: int) -> int:
    """accelerate in its own session, holding the run lock too. ftune forwards SIGTERM (the worker saves a
    checkpoint at the current step and exits 143) and Ctrl-C to it, and waits for it to finish."""
    proc = subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=_launcher_child,
                            pass_fds=(lock_fd,))
    previous = signal.signal(signal.SIGTERM, lambda *_: _forward(proc, signal.SIGTERM))
    try:
        return proc.wait()
    except KeyboardInterrupt:
        _wait_after_interrupt(proc)
        raise FtuneError(
            "interrupted; the run dir keeps every complete checkpoint",
            hint="rerun the same command to continue (checkpoint.resume: auto)",
            exit_code=EXIT_INTERRUPTED,
        ) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
