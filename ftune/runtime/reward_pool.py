"""Rewards scored where a runaway can be stopped: one child process holds the recipe's scored rewards, the run
sends it a batch of completions, and waits at most `train.rl.reward_timeout` seconds for each row's score.

A reward past its limit (a regular expression backtracking catastrophically, a plugin's endless loop: C code that
neither a signal nor another thread can interrupt) is killed with its process and named with the row and the
limit (`RewardTimeout`, exit 3). A stop requested while a reward runs (`INTERRUPT`, set by the worker's SIGTERM
handler) abandons the step (`RewardsInterrupted`): the run checkpoints its last complete step and exits 143, within
the scheduler's grace whatever the reward does. The child checks each score's type: a number, never text.

Light: stdlib and ftune.rewards in the parent; the child imports each reward's scoring code (and dies with its
parent). Run as `python -m ftune.runtime.reward_pool` by `Pool` only.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from ftune.errors import RunError

INTERRUPT = threading.Event()
"""Set by the worker's SIGTERM handler while training: the reward in flight is abandoned (the step is lost)."""
POLL_S = 0.05
"""How often a wait checks INTERRUPT (a stop reaches the run within this, whatever the reward does)."""
START_S = 300.0
"""The child's start (Python, then each reward's import: TRL's take seconds) has its own, looser limit."""
FLOAT32_MAX = 3.4028234663852886e38
"""TRL holds rewards (and their weighted total) in float32: a larger score is inf there."""


class RewardTimeout(RunError):
    """A reward ran past `train.rl.reward_timeout` on one row; its process was killed."""


class RewardsInterrupted(Exception):
    """A stop (SIGTERM) arrived while a reward was scoring: the step is abandoned."""


@dataclass(frozen=True)
class Entry:
    """One scored reward as the child builds it: `make(args) -> score`."""

    name: str
    make: str
    args: Any


def not_a_number(value) -> str | None:
    """Why a reward's return value is no score, or None: a number is what float() reads as one (int, float, bool,
    a numpy or 0-d torch scalar), never text (float('1') would parse it) and never a container."""
    if isinstance(value, (str, bytes)) or not (hasattr(value, "__float__") or hasattr(value, "__index__")):
        shown = repr(value)
        return f"returned {type(value).__name__} {shown[:60]}{'...' if len(shown) > 60 else ''}, not a number"
    return None


class ChildProcess:
    """A child `python -m MODULE` reached over one duplex channel on its pipes, closed at exit: the reward pool's
    and the tool pool's (`ftune.runtime.tool_pool`). `start()` spawns it when none is alive (`_start`)."""

    MODULE = ""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.conn: _Duplex | None = None
        atexit.register(self.close)

    def start(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self._start()

    def _start(self) -> None:
        raise NotImplementedError

    def _spawn(self) -> None:
        proc = subprocess.Popen([sys.executable, "-m", self.MODULE], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, close_fds=True)
        self.proc = proc
        # one duplex channel over the two pipes: the child reads fd 0 and writes the fd 1 it was given
        self.conn = _Duplex(Connection(os.dup(proc.stdout.fileno()), writable=False),
                            Connection(os.dup(proc.stdin.fileno()), readable=False))

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.close()

    def close(self) -> None:
        """End the child: its stdin's EOF ends its loop (a killed one is only reaped)."""
        proc, conn, self.proc, self.conn = self.proc, self.conn, None, None
        if proc is None:
            return
        for stream in (conn.read, conn.write, proc.stdin, proc.stdout) if conn else (proc.stdin, proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Pool(ChildProcess):
    """The child process scoring `entries`; `score(i, samples)` answers row by row under `limit_s` each.
    `start()` builds every reward now (a plugin that fails to load is named before training)."""

    MODULE = "ftune.runtime.reward_pool"

    def __init__(self, entries: list[Entry], limit_s: float):
        self.entries, self.limit_s = entries, limit_s
        super().__init__()

    def _start(self) -> None:
        self._spawn()
        self.conn.send(self.entries)
        kind, detail = self._answer(None, "starting", "", START_S)
        if kind != "ready":
            self.close()
            raise RunError(f"reward '{detail[0]}' failed to start: {detail[1]}",
                           hint="fix the reward's plugin (or uninstall it), or remove it from train.rl.rewards")

    def score(self, index: int, samples: list, rows: list[str]) -> list[float]:
        """Scores of reward `index` for `samples`; RunError naming the reward and the row on a failure."""
        self.start()
        name = self.entries[index].name
        if INTERRUPT.is_set():
            raise RewardsInterrupted(name)
        self.conn.send((index, samples))
        out = []
        for j, sample in enumerate(samples):
            kind, detail = self._answer(index, rows[j], sample.completion)
            if kind == "ok":
                out.append(detail)
                continue
            self.kill()  # the child still answers the rows after this one: a later call starts afresh
            shown = f"completion: {sample.completion[:120]!r}; answer: {sample.answer!r}"
            if kind == "raised":
                raise RunError(f"reward '{name}' failed on {rows[j]}: {detail}",
                               hint=f"{shown}. Fix the row or the reward's arguments")
            raise RunError(f"reward '{name}' {detail} on {rows[j]}",
                           hint=f"{shown}; a reward must be a finite number (int or float) for every completion "
                           "(a NaN would silently drop the group's learning signal)")
        return out

    def _answer(self, index: int | None, row: str, completion: str, limit_s: float | None = None):
        """The child's next answer, within `limit_s` (the reward's limit); index None: the start."""
        deadline = time.monotonic() + (limit_s or self.limit_s)
        while True:
            if INTERRUPT.is_set():
                self.kill()
                raise RewardsInterrupted(self.entries[index or 0].name)
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                if index is None:
                    raise RunError(f"the rewards' process took longer than {START_S:g} s to import the rewards",
                                   hint="a reward plugin's import hangs: fix or uninstall it")
                raise RewardTimeout(
                    f"reward '{self.entries[index].name}' took longer than its limit of {self.limit_s:g} s on {row}",
                    hint=f"completion: {completion[:120]!r}. A regular expression that backtracks (nested repeats "
                    "such as `(a+)+`, or overlapping alternatives under a repeat such as `(.|.)*`) can run for hours "
                    "on one text: rewrite the pattern, or raise train.rl.reward_timeout")
            try:
                if self.conn.poll(min(POLL_S, left)):
                    return self.conn.recv()
            except (EOFError, OSError):
                code = self.proc.wait() if self.proc is not None else None
                self.kill()
                if INTERRUPT.is_set():
                    raise RewardsInterrupted(self.entries[index or 0].name) from None
                what = "its process" if index is None else f"reward '{self.entries[index].name}'"
                raise RunError(f"{what} ended (exit code {code}) on {row}",
                               hint="a reward may not exit the process or crash it; fix the reward") from None

class _Duplex:
    def __init__(self, read: Connection, write: Connection):
        self.read, self.write = read, write

    def send(self, obj) -> None:
        self.write.send(obj)

    def poll(self, timeout: float) -> bool:
        return self.read.poll(timeout)

    def recv(self):
        return self.read.recv()


def child_channel() -> tuple[Connection, Connection]:
    """The child's side of `ChildProcess`: it dies with its parent, leaves Ctrl-C and SIGTERM (a launcher signals
    the whole process group) to the run, which ends it (kill, or the pipe's EOF), and reads fd 0 and writes a copy
    of fd 1, whose own number now goes to stderr: a reward's or tool's print never lands in the channel."""
    import signal

    from ftune.lifecycle import die_with_parent

    die_with_parent(signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    out_fd = os.dup(1)
    os.dup2(2, 1)
    return Connection(0, writable=False), Connection(out_fd, readable=False)


def _serve() -> None:
    """The child: build every reward, then answer each (index, samples) with one message per row."""
    import math

    read, write = child_channel()
    from ftune.plugins import load_object

    scores, name = [], "?"
    try:
        for entry in read.recv():
            name = entry.name
            scores.append(load_object(entry.make)(entry.args))
    except Exception as err:  # noqa: BLE001 - a plugin's: named to the run
        write.send(("failed", (name, getattr(err, "message", None) or f"{type(err).__name__}: {err}")))
        return
    write.send(("ready", None))
    while True:
        try:
            index, samples = read.recv()
        except EOFError:
            return
        for sample in samples:
            try:
                value = scores[index](sample)
            except BaseException as err:  # noqa: BLE001 - the reward is the user's (or a plugin's): say which and where
                write.send(("raised", f"called sys.exit({err.code!r})" if isinstance(err, SystemExit)
                            else f"{type(err).__name__}: {err}"))
                continue
            why = not_a_number(value)
            if why is not None:
                write.send(("type", why))
                continue
            try:
                number = float(value)
            except (TypeError, ValueError, OverflowError) as err:
                write.send(("type", f"returned {value!r}, which is no number ({err})"))
                continue
            if not math.isfinite(number):
                write.send(("value", f"returned {number}"))
            elif abs(number) > FLOAT32_MAX:
                write.send(("value", f"returned {number:g}, past float32's range (TRL keeps rewards in float32)"))
            else:
                write.send(("ok", number))


if __name__ == "__main__":
    _serve()
