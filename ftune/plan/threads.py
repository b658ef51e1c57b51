"""CPU threads per worker process and OpenMP's wait policy: decided once, at compile time, recorded in the Plan.

Measured on a shared 2-core machine (docs/performance.md, `bench/bench_threads.py`): with OpenMP's default wait
policy, threads spin at every barrier, and when another process holds one of the cores a step became 8-21x
slower than with one thread. A passive wait policy (threads sleep at a barrier) removes that collapse, and one
thread per core with it was the fastest setting measured, on the busy machine as under two extra CPU-bound
processes: the scheduler shares CPU time per thread, so a second thread that does not spin still gets its share.
So, in this order:
  - a user's `OMP_NUM_THREADS` (and `OMP_WAIT_POLICY`) win, then `train.threads`;
  - otherwise physical cores / local processes, with a passive wait policy when that is more than one thread.
The same on CUDA: accelerate's own default there is 1 thread per process, and the host side of a GPU step is not
free. Measured on an H200 (docs/performance.md): a bf16 LoRA step on a batch of a new shape (cuDNN builds an
attention plan for each) took 1.2-2.5 s more with 1 thread, and LoRA ran at 0.58-0.68x a plain Trainer script
(which keeps torch's default of all cores); with the cores it ran at 1.10x.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict


class CpuThreads(BaseModel):
    """The CPU threads of each worker process, and why (shown in the run header and plan.json)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    threads: int
    """OMP_NUM_THREADS (torch's intra-op threads) per process."""
    wait_policy: Literal["passive", "active"] | None = None
    """OMP_WAIT_POLICY; None leaves OpenMP's default (spin a while, then sleep)."""
    reason: str
    """Why: the setting that chose it, or the cores and processes."""

    def env(self) -> dict[str, str]:
        env = {"OMP_NUM_THREADS": str(self.threads)}
        return env | ({"OMP_WAIT_POLICY": self.wait_policy.upper()} if self.wait_policy else {})

    def describe(self) -> str:
        policy = f", {self.wait_policy} wait" if self.wait_policy else ""
        return f"{self.threads} thread{'s' if self.threads != 1 else ''} per process{policy} ({self.reason})"


def physical_cores() -> int:
    try:
        import psutil

        return psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except ImportError:  # pragma: no cover - psutil comes with accelerate
        return os.cpu_count() or 1


def _plural(n: int, word: str, suffix: str = "s") -> str:
    return f"{n} {word}{suffix if n != 1 else ''}"


def decide(setting: int | Literal["auto"], num_processes: int, *, cores: int,
           environ: dict[str, str] | os._Environ) -> CpuThreads:
    """Threads per process for a CPU run (`setting` is `train.threads`). Pure: the machine comes in as arguments."""
    user_policy = environ.get("OMP_WAIT_POLICY", "").lower() or None
    if user_policy not in (None, "passive", "active"):
        user_policy = None  # not a value OpenMP knows: not passed on
    if (value := environ.get("OMP_NUM_THREADS", "").strip()).isascii() and value.isdigit() and int(value) > 0:
        return CpuThreads(threads=int(value), wait_policy=user_policy, reason="OMP_NUM_THREADS is set")
    if setting != "auto":
        threads, reason = setting, "train.threads"
    else:
        threads = max(1, cores // max(num_processes, 1))
        reason = f"{_plural(cores, 'physical core')} / {_plural(num_processes, 'process', 'es')}"
    return CpuThreads(threads=threads, wait_policy=user_policy or ("passive" if threads > 1 else None), reason=reason)


def cpu_threads(setting: int | Literal["auto"], num_processes: int) -> CpuThreads:
    """`decide` on this machine."""
    return decide(setting, num_processes, cores=physical_cores(), environ=os.environ)


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity mask: a container's or a job's share), else all."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def cap_num_proc(recipe, cores: int):
    """`data.num_proc` at most `cores`: more preprocessing processes than CPUs only add start-up and switching
    (1000 on 2 cores took 37 s instead of 4 s). Returns the recipe to run and the warning saying so (or none)."""
    asked = recipe.data.num_proc
    if asked is None or asked <= cores:
        return recipe, []
    from ftune.errors import Problem

    warning = Problem(f"{asked} is more than this machine's {cores} usable CPU "
                      f"core{'s' if cores != 1 else ''}: preprocessing uses {cores} processes", path="data.num_proc",
                      hint=f"set data.num_proc: {cores} (or less) to silence this", severity="warning")
    data = recipe.data.model_copy(update={"num_proc": cores})
    return recipe.model_copy(update={"data": data}), [warning]
