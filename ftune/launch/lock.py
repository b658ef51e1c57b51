"""One live run per run dir: ownership (the run-dir marker) and the lock (`<run>/.ftune.lock`).

`claim(run)` makes the folder ftune's (creating it, or adopting an empty one, writes the marker) and takes
the lock before anything else is written there. The lock is an exclusive `flock` on the lock file, which
also records the holder (pid, host, start time, command) for the message a second process gets. The
kernel drops a `flock` when its last holder dies, so a lock left by a killed process on this host is
detected (its pid is gone) and taken over; one left by another host is refused, naming the file.

Light module (no torch): `ftune run` and `ftune eval` take it in the parent process; the workers inherit it.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ftune import __version__
from ftune.errors import EXIT_BUSY, FtuneError

# the probe (who holds a run dir) is shared with the output policy, which refuses a live run dir as an output
from ftune.outputs import describe_holder as describe
from ftune.outputs import lock_holder, pid_alive  # noqa: F401
from ftune.outputs import read_lock_record as _read
from ftune.outputs import start_ticks as _start_ticks
from ftune.rundir import RunDir, write_json_atomic


@dataclass
class RunLock:
    """A held lock; `release()` (or leaving the `with` block) removes the lock file and drops it."""

    run: RunDir
    fd: int
    took_over: dict | None = None
    """The holder of a stale lock this one replaced (its process is gone), or None."""

    def release(self) -> None:
        if self.fd < 0:
            return
        try:
            if os.fstat(self.fd).st_ino == os.stat(self.run.lock).st_ino:
                self.run.lock.unlink()  # while still holding it: a waiter re-checks the inode
        except OSError:
            pass
        os.close(self.fd)
        self.fd = -1

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def busy_error(run: RunDir, found: dict) -> FtuneError:
    stop = f"`kill {found['pid']}`" if "pid" in found else "`kill PID`"
    return FtuneError(
        f"{run.root} is in use by {describe(found)}",
        hint=f"wait for it to finish, or stop it ({stop} saves a checkpoint to resume from); "
        "to run both at once, give this one another output.dir",
        exit_code=EXIT_BUSY,
    )


def acquire(run: RunDir, command: str) -> RunLock:
    """Take the run dir's lock (the folder must exist). Raises `FtuneError` (exit 5) naming a live holder."""
    host = socket.gethostname()
    for _ in range(5):
        fd = os.open(run.lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            found = _read(fd)
            os.close(fd)
            raise busy_error(run, found) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(run.lock).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # the holder released (and removed) it between our open and flock: try the new file
            os.close(fd)
            continue
        previous = _read(fd) or None
        if previous and previous.get("host") != host:
            os.close(fd)
            raise FtuneError(
                f"{run.root} is locked by {describe(previous)}, another machine",
                hint=f"if that run is no longer running, delete {run.lock} and rerun",
                exit_code=EXIT_BUSY,
            )
        if previous and pid_alive(int(previous.get("pid", -1)), previous.get("pid_start")):
            os.close(fd)  # alive but not holding the flock (a filesystem without flock): trust the record
            raise busy_error(run, previous)
        me = {"pid": os.getpid(), "pid_start": _start_ticks(os.getpid()), "host": host, "command": command,
              "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "ftune": __version__}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        os.fsync(fd)
        return RunLock(run, fd, took_over=previous)
    raise busy_error(run, {"command": "another ftune process"})


def claim(run: RunDir, command: str, machine_rank: int = 0) -> tuple[RunLock, Path | None]:
    """Make `run.root` ftune's and lock it. Returns the lock and the topmost folder this call created
    (a start that fails before training removes it). A non-empty folder without the marker is refused:
    ftune writes and deletes only in folders it created.

    Node `machine_rank` > 0 of a multi-node job sharing the run dir takes its own lock (`nodes/node<k>/`),
    never the run's, which node 0 holds: it never refuses the run node 0 owns, and two copies of one node do."""
    created = None
    probe = run.root
    while not probe.exists():
        created, probe = probe, probe.parent
    run.root.mkdir(parents=True, exist_ok=True)
    if not run.is_owned() and run.foreign_entries():
        raise FtuneError(f"{run.root} exists and was not created by ftune (it has no {run.marker.name})",
                         hint="ftune writes and deletes only in folders it created: choose a new output.dir "
                         "or an empty folder")
    node = run.node(machine_rank)
    node.root.mkdir(parents=True, exist_ok=True)
    lock = acquire(node, f"ftune {command}" + (f" (node {machine_rank})" if machine_rank else ""))
    if not run.is_owned():
        write_json_atomic(run.marker, {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                       "ftune": __version__})
    return lock, created if machine_rank == 0 else None
