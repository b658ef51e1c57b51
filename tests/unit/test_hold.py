"""The test-only hold (ftune/worker/hold.py) that the fault tests signal a run under, and `make test-matrix`'s list."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from ftune.worker import hold
from ftune.worker.stop import STOP

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def held_env(tmp_path, monkeypatch):
    monkeypatch.setenv(hold.ENV_STEP, "3")
    monkeypatch.setenv(hold.ENV_DIR, str(tmp_path))
    monkeypatch.setattr(STOP, "signum", None)
    return tmp_path


def _at(step: int):
    return SimpleNamespace(global_step=step)


def test_off_unless_the_environment_asks(monkeypatch):
    for name in (hold.ENV_STEP, hold.ENV_DIR, hold.ENV_DELAY):
        monkeypatch.delenv(name, raising=False)
    assert not hold.enabled()
    monkeypatch.setenv(hold.ENV_DELAY, "0.1")
    assert hold.enabled()


def test_holds_only_at_its_step_until_released(held_env):
    cb = hold.callback(rank=1)
    cb.on_step_begin(None, _at(2), None)  # another step: returns at once, writes nothing
    assert not hold.held_file(held_env, 1).exists()

    def release_when_held():  # an event, never a clock: the release follows the held file
        while not hold.held_file(held_env, 1).exists():
            threading.Event().wait(0.005)
        (held_env / hold.RELEASE).write_text("")

    releaser = threading.Thread(target=release_when_held)
    releaser.start()
    cb.on_step_begin(None, _at(3), None)
    releaser.join()
    assert hold.held_file(held_env, 1).read_text() == "3\n"
    assert not hold.held_file(held_env, 0).exists()


def test_sigterm_ends_the_hold(held_env):
    """The worker's SIGTERM handler only records the signal: the hold must let the step run so it is saved."""
    cb = hold.callback(rank=0)

    def signal_when_held():
        while not hold.held_file(held_env, 0).exists():
            threading.Event().wait(0.005)
        STOP.signum = 15  # what StopRequest._handle records

    timer = threading.Thread(target=signal_when_held)
    timer.start()
    cb.on_step_begin(None, _at(3), None)
    timer.join()
    assert STOP.requested and not (held_env / hold.RELEASE).exists()


def test_matrix_runs_files_that_exist():
    """`make test-matrix` names its test files in the Makefile: a renamed file would silently drop out."""
    text = (ROOT / "Makefile").read_text()
    block = re.search(r"^NUMERICS_TESTS \?=(.*?)\n(?=\S)", text, re.S | re.M).group(1)
    files = block.replace("\\", " ").split()
    assert len(files) >= 5 and all((ROOT / f).exists() for f in files), files


def test_ranks_hold_side_by_side_in_one_folder(held_env):
    """Every rank of a run (nodes too) writes into the same folder: each its own held file, whole."""
    ranks = [threading.Thread(target=hold.callback(rank=r).on_step_begin, args=(None, _at(3), None)) for r in range(4)]
    for t in ranks:
        t.start()
    while not all(hold.held_file(held_env, r).exists() for r in range(4)):
        threading.Event().wait(0.005)
    (held_env / hold.RELEASE).write_text("")
    for t in ranks:
        t.join()
    assert [hold.held_file(held_env, r).read_text() for r in range(4)] == ["3\n"] * 4
    assert sorted(p.name for p in held_env.iterdir()) == ["held.rank0", "held.rank1", "held.rank2", "held.rank3",
                                                         "release"]
