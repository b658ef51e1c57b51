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

The wait policy depends on the machine at launch (#42): passive waiting is what keeps a loaded machine from
collapsing, but on an idle one every parallel region then pays a futex wake-up, and a real MiniLM run took 1.41x
a plain script's train time (0.99x with an active wait). So the CPUs the run may use are sampled at launch
(`read_load`, /proc/stat over SAMPLE_S, and again over LOOK_AGAIN_S when the 1-minute load average shows work the first
sample didn't see): when they have room for the run's threads, OpenMP keeps its default wait
(libgomp, which torch ships: spin about 3 ms, then sleep), the same as a plain script's; otherwise, or when the load
can't be read, threads sleep at once (passive). Not `active`: its spin is unbounded (minutes), so load that comes
after launch (another job, the run's own dataloader workers) would collapse the run as spinning did in #30, and it
measured no faster than the default (0.99x against the plain script's default). A user's OMP_WAIT_POLICY wins.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict


SAMPLE_S = 0.25
"""How long the launch samples the CPUs' load (/proc/stat counts in 10 ms ticks: 50 ticks on 2 CPUs)."""
LOOK_AGAIN_S = 0.75
"""A second, longer sample when the 1-minute load average shows more work than the first sample saw: a bursty
machine's 0.25 s can fall in a gap, and a run that just ended (the user's previous one) still counts in the average
for a minute. The probe stays under a second."""
SLACK_CPUS = 0.5
"""Other work the CPUs may carry and still count as idle: a shell, an editor, the odd daemon."""


class CpuLoad(BaseModel):
    """A reading of the CPUs this process may run on (its affinity), taken at launch."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: int
    """Logical CPUs the run may use (its affinity)."""
    busy: float
    """CPUs' worth of work other processes did during the sample."""
    load_average: float | None = None
    """The 1-minute load average at launch. It decides nothing itself: it remembers finished work (a run that ended
    a minute ago made back-to-back runs on an idle machine wait passively, 1.12x the plain script), but when it
    shows more work than the first sample saw, the launch looks again, longer (a bursty machine's sample can fall
    in a gap: 0.0 busy was read at a load average of 2.4, and the spinning run then took 3x the plain script's)."""
    looked_again: bool = False
    """Whether `busy` includes the second, longer sample."""

    def other_work(self) -> float:
        """CPUs' worth of other work, as sampled (the busier of the samples when the launch looked twice)."""
        return self.busy

    def describe(self) -> str:
        average = f", load average {self.load_average:.2f}" if self.load_average is not None else ""
        again = f" (sampled for {SAMPLE_S + LOOK_AGAIN_S:g} s)" if self.looked_again else ""
        return f"{self.busy:.2f} of {_plural(self.cpus, 'CPU')} busy at launch{again}{average}"


class CpuThreads(BaseModel):
    """The CPU threads of each worker process, and why (shown in the run header and plan.json)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    threads: int
    """OMP_NUM_THREADS (torch's intra-op threads) per process."""
    wait_policy: Literal["passive", "active"] | None = None
    """OMP_WAIT_POLICY; None leaves OpenMP's default (libgomp: spin about 3 ms, then sleep)."""
    reason: str
    """Why: the setting that chose it, or the cores and processes."""
    wait_reason: str | None = None
    """Why this wait policy: the user's OMP_WAIT_POLICY, one thread, or the load read at launch."""
    load: CpuLoad | None = None
    """The load read at launch, when the wait policy was decided from it."""

    def env(self) -> dict[str, str]:
        env = {"OMP_NUM_THREADS": str(self.threads)}
        return env | ({"OMP_WAIT_POLICY": self.wait_policy.upper()} if self.wait_policy else {})

    def describe(self) -> str:
        policy = (f", {self.wait_policy} wait" if self.wait_policy
                  else ", OpenMP's default wait" if self.wait_reason else "")
        why = f"; {self.wait_reason}" if self.wait_reason else ""
        return f"{self.threads} thread{'s' if self.threads != 1 else ''} per process{policy} ({self.reason}{why})"


def physical_cores() -> int:
    try:
        import psutil

        return psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except ImportError:  # pragma: no cover - psutil comes with accelerate
        return os.cpu_count() or 1


def _plural(n: int, word: str, suffix: str = "s") -> str:
    return f"{n} {word}{suffix if n != 1 else ''}"


def decide(setting: int | Literal["auto"], num_processes: int, *, cores: int,
           environ: dict[str, str] | os._Environ, load: Callable[[], CpuLoad | None]) -> CpuThreads:
    """Threads per process for a run (`setting` is `train.threads`) and their wait policy. Pure: the machine comes in
    as arguments; `load` reads it and is called only when the wait policy is decided from it."""
    user_policy = environ.get("OMP_WAIT_POLICY", "").lower() or None
    if user_policy not in (None, "passive", "active"):
        user_policy = None  # not a value OpenMP knows: not passed on
    if (value := environ.get("OMP_NUM_THREADS", "").strip()).isascii() and value.isdigit() and int(value) > 0:
        threads, reason = int(value), "OMP_NUM_THREADS is set"
        if user_policy is None:  # the user's own setup: OpenMP's default wait, as before ftune
            return CpuThreads(threads=threads, reason=reason)
    elif setting != "auto":
        threads, reason = setting, "train.threads"
    else:
        threads = max(1, cores // max(num_processes, 1))
        reason = f"{_plural(cores, 'physical core')} / {_plural(num_processes, 'process', 'es')}"
    if user_policy is not None:
        return CpuThreads(threads=threads, reason=reason, wait_policy=user_policy,
                          wait_reason="OMP_WAIT_POLICY is set")
    if threads == 1:  # one thread: nothing waits at a barrier
        return CpuThreads(threads=threads, reason=reason)
    reading = load()
    policy, why = wait_policy(reading, threads * max(num_processes, 1))
    return CpuThreads(threads=threads, reason=reason, wait_policy=policy, wait_reason=why, load=reading)


def wait_policy(reading: CpuLoad | None, threads: int) -> tuple[Literal["passive"] | None, str]:
    """OpenMP's default (spin a while, then sleep) when the CPUs have room for all of the run's `threads` (all local
    processes'), else sleep at once: a spinning thread burns the CPU time of the thread it waits for whenever that
    one isn't scheduled (10.8x slower, #30)."""
    if reading is None:
        return "passive", "the CPUs' load could not be read"
    spare = reading.cpus - reading.other_work()
    if spare + SLACK_CPUS >= threads:
        return None, f"{reading.describe()}: room for {_plural(threads, 'thread')}"
    return "passive", f"{reading.describe()}: no room for {_plural(threads, 'spinning thread')}"


def _proc_stat() -> str:
    with open("/proc/stat") as f:
        return f.read()


def read_load(seconds: float = SAMPLE_S, *, stat: Callable[[], str] = _proc_stat,
              sleep: Callable[[float], None] = time.sleep,
              load_average: Callable[[], float] = lambda: os.getloadavg()[0]) -> CpuLoad | None:
    """The busy share of the CPUs in this process's affinity over `seconds`, from /proc/stat; None off Linux. When
    the 1-minute load average shows more work than that sample saw, a second sample of LOOK_AGAIN_S follows and
    the busier one counts (the readers are arguments so each branch is tested without this machine's load)."""
    try:
        cpus = os.sched_getaffinity(0)
        before = stat()
        sleep(seconds)
        after = stat()
        average = round(load_average(), 2)
    except (OSError, AttributeError):
        return None
    reading = load_between(before, after, cpus)
    if reading is None:
        return None
    reading = reading.model_copy(update={"load_average": average})
    if min(average, reading.cpus) > reading.busy + SLACK_CPUS:  # the average saw work this sample didn't
        try:
            sleep(LOOK_AGAIN_S)
            again = load_between(after, stat(), cpus)
        except OSError:
            again = None
        busy = max(reading.busy, again.busy) if again else reading.busy
        reading = reading.model_copy(update={"busy": busy, "looked_again": True})
    return reading


def load_between(before: str, after: str, cpus: set[int]) -> CpuLoad | None:
    """The load of `cpus` between two /proc/stat snapshots; idle and iowait ticks are not busy."""
    (b0, t0), (b1, t1) = _ticks(before, cpus), _ticks(after, cpus)
    if not cpus or t1 - t0 <= 0:
        return None
    return CpuLoad(cpus=len(cpus), busy=round(len(cpus) * (b1 - b0) / (t1 - t0), 2))


def _ticks(stat: str, cpus: set[int]) -> tuple[int, int]:
    """(busy ticks, all ticks) of `cpus` in a /proc/stat snapshot."""
    busy = total = 0
    for line in stat.splitlines():
        name, *fields = line.split() or [""]
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            values = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
            busy, total = busy + sum(values) - values[3] - values[4], total + sum(values)
    return busy, total


def cpu_threads(setting: int | Literal["auto"], num_processes: int) -> CpuThreads:
    """`decide` on this machine, now."""
    return decide(setting, num_processes, cores=physical_cores(), environ=os.environ, load=read_load)



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
