"""Runs held at a step (ftune/worker/hold.py): a test that signals a run first waits until the run is provably
there, so the result never depends on how fast the CPU trains. The timeouts below only bound a hung run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from ftune.worker.hold import ENV_DELAY, ENV_DIR, ENV_STEP, RELEASE, held_file


def hold_env(step: int, folder: Path, delay: float | None = None) -> dict:
    """The environment that holds a run after `step` (files in `folder`), each step slowed by `delay` s."""
    return {ENV_STEP: str(step), ENV_DIR: str(folder), **({ENV_DELAY: str(delay)} if delay else {})}


def start_held(recipe: Path, cwd: Path, step: int, folder: Path, *args: str, env: dict | None = None,
               delay: float | None = None) -> subprocess.Popen:
    """`ftune run recipe` in its own session (a terminal's foreground group), held after `step`."""
    for stale in folder.glob("*") if folder.is_dir() else ():
        stale.unlink()  # a held file or release of an earlier launch
    return subprocess.Popen([sys.executable, "-m", "ftune.cli.main", "run", str(recipe), *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, **(env or {}), **hold_env(step, folder, delay)})


def wait_held(proc: subprocess.Popen, folder: Path, ranks: tuple[int, ...] = (0,), timeout: float = 400) -> int:
    """Block until every rank in `ranks` holds; the step they hold at. A run that ends first fails the test with
    its output (it never reached the step)."""
    deadline = time.monotonic() + timeout
    files = [held_file(folder, r) for r in ranks]
    while not all(f.exists() for f in files):
        if proc.poll() is not None:
            out, err = proc.communicate()
            tail = "\n".join(text[-3000:] for text in (out, err) if text)
            raise AssertionError(f"the run ended (exit {proc.returncode}) before holding:\n{tail}")
        assert time.monotonic() < deadline, f"no rank held within {timeout} s"
        time.sleep(0.02)
    steps = {int(f.read_text()) for f in files}
    assert len(steps) == 1, steps
    return steps.pop()


def release(folder: Path) -> None:
    (folder / RELEASE).write_text("")
