"""Process lifetime shared by the launcher and the workers: no process of a run outlives the `ftune` that
started it. Linux: the kernel sends a signal when the parent dies (`PR_SET_PDEATHSIG`); elsewhere a
daemon thread polls the parent pid. Light (ctypes only)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1

PLAN_DIGEST_ENV = "FTUNE_PLAN_SHA256"
"""sha256 of plan.json as the launcher wrote it: the worker refuses a plan rewritten since."""


def _prctl_pdeathsig(sig: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(sig: int = signal.SIGKILL, poll_s: float = 1.0) -> None:
    """Get `sig` when the parent process dies (any cause, SIGKILL included). Safe in a `preexec_fn`."""
    parent = os.getppid()
    if _prctl_pdeathsig(sig):
        if os.getppid() != parent:  # it died before prctl took effect
            os.kill(os.getpid(), sig)
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), sig)

    threading.Thread(target=watch, name="ftune-parent-watch", daemon=True).start()
