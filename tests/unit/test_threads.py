"""The CPU thread decision (ftune.plan.threads): every branch forced, whatever this machine's cores and load."""

from __future__ import annotations

import pytest

from ftune.plan import threads
from ftune.plan.threads import CpuLoad, CpuThreads, decide, wait_policy

IDLE = CpuLoad(cpus=4, busy=0.1)
LOADED = CpuLoad(cpus=4, busy=2.0)  # two CPU-bound processes beside the run


def idle():
    return IDLE


def loaded():
    return LOADED


def unread():
    return None


def not_read():
    raise AssertionError("the load is read only when the wait policy is decided from it")


def test_one_thread_per_core_with_openmps_own_wait_on_an_idle_machine():
    """Idle: no OMP_WAIT_POLICY, so OpenMP spins a while before sleeping, as in a plain script."""
    t = decide("auto", 1, cores=4, environ={}, load=idle)
    assert (t.threads, t.wait_policy, t.load) == (4, None, IDLE)
    assert t.env() == {"OMP_NUM_THREADS": "4"}
    assert t.describe() == ("4 threads per process, OpenMP's default wait (4 physical cores / 1 process; "
                            "0.10 of 4 CPUs busy at launch: room for 4 threads)")


def test_a_passive_wait_on_a_loaded_machine():
    t = decide("auto", 1, cores=4, environ={}, load=loaded)
    assert (t.threads, t.wait_policy, t.load) == (4, "passive", LOADED)
    assert t.env() == {"OMP_NUM_THREADS": "4", "OMP_WAIT_POLICY": "PASSIVE"}
    assert t.describe() == ("4 threads per process, passive wait (4 physical cores / 1 process; "
                            "2.00 of 4 CPUs busy at launch: no room for 4 spinning threads)")
    # a load that can't be read (not Linux) is taken as a loaded machine: sleeping costs little, spinning a lot
    t = decide("auto", 1, cores=4, environ={}, load=unread)
    assert (t.wait_policy, t.wait_reason, t.load) == ("passive", "the CPUs' load could not be read", None)


@pytest.mark.parametrize(("busy", "policy"), [(0.5, None), (0.51, "passive")])
def test_the_idle_threshold_is_half_a_cpu_of_other_work(busy, policy):
    """SLACK_CPUS: 2 threads on 2 CPUs spin while others use at most half a CPU."""
    assert threads.SLACK_CPUS == 0.5
    assert decide("auto", 1, cores=2, environ={}, load=lambda: CpuLoad(cpus=2, busy=busy)).wait_policy == policy


def _stat(busy: int, idle: int) -> str:
    """A /proc/stat snapshot of CPUs 0 and 1 with these cumulative busy (user) and idle ticks each."""
    return "".join(f"cpu{i} {busy} 0 0 {idle} 0 0 0 0\n" for i in (0, 1))


def _read(snapshots: list[str], average: float):
    """read_load on CPUs 0-1 with these /proc/stat snapshots in turn and this load average; (reading, sleeps)."""
    snaps, sleeps = iter(snapshots), []
    with pytest.MonkeyPatch.context() as m:
        m.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1})
        reading = threads.read_load(stat=lambda: next(snaps), sleep=sleeps.append, load_average=lambda: average)
    return reading, sleeps


def test_a_busy_load_average_makes_the_launch_look_again():
    """The load average decides nothing itself (it remembers a run that ended a minute ago: back-to-back runs on an
    idle machine waited passively, 1.12x the plain script); when it shows work the first sample didn't see, a second,
    longer sample decides (a bursty machine's 0.25 s can fall in a gap)."""
    quiet, burst = [_stat(0, 0), _stat(0, 25), _stat(0, 100)], [_stat(0, 0), _stat(0, 25), _stat(60, 100)]
    reading, sleeps = _read(quiet, 1.34)  # the previous run's echo: both samples quiet -> OpenMP's default wait
    assert (reading.busy, reading.looked_again, sleeps) == (0.0, True, [threads.SAMPLE_S, threads.LOOK_AGAIN_S])
    assert wait_policy(reading, 2)[0] is None
    assert wait_policy(reading, 2)[1] == ("0.00 of 2 CPUs busy at launch (sampled for 1 s), load average 1.34: "
                                          "room for 2 threads")
    reading, _ = _read(burst, 2.4)  # the gap: the second sample catches the bursts -> passive
    assert reading.busy == round(2 * 60 / 135, 2) and wait_policy(reading, 2)[0] == "passive"
    reading, sleeps = _read(quiet[:2], 0.3)  # the average agrees with the sample: one look
    assert (reading.looked_again, sleeps) == (False, [threads.SAMPLE_S])
    assert CpuLoad(cpus=2, busy=0.2, load_average=2.0).other_work() == 0.2


def test_all_local_processes_threads_need_room():
    """2 processes x 2 threads on 4 CPUs with one CPU busy: 3 spare for 4 spinning threads is not enough."""
    t = decide("auto", 2, cores=4, environ={}, load=lambda: CpuLoad(cpus=4, busy=1.0))
    assert (t.threads, t.wait_policy) == (2, "passive")
    assert decide("auto", 2, cores=4, environ={}, load=lambda: CpuLoad(cpus=8, busy=1.0)).wait_policy is None


def test_cores_are_divided_among_the_processes():
    assert decide("auto", 2, cores=8, environ={}, load=idle).threads == 4
    one = decide("auto", 2, cores=2, environ={}, load=not_read)
    assert (one.threads, one.wait_policy, one.load) == (1, None, None)  # one thread: nothing waits at a barrier
    assert one.env() == {"OMP_NUM_THREADS": "1"}
    assert one.describe() == "1 thread per process (2 physical cores / 2 processes)"
    assert decide("auto", 4, cores=2, environ={}, load=not_read).threads == 1


def test_the_recipe_overrides_the_default():
    t = decide(3, 1, cores=2, environ={}, load=loaded)
    assert (t.threads, t.wait_policy, t.reason) == (3, "passive", "train.threads")
    assert decide(3, 1, cores=2, environ={}, load=lambda: CpuLoad(cpus=4, busy=0.0)).wait_policy is None
    assert decide(1, 1, cores=8, environ={}, load=not_read).wait_policy is None


def test_the_environment_wins_over_everything():
    env = {"OMP_NUM_THREADS": "5", "OMP_WAIT_POLICY": "active"}
    t = decide(2, 1, cores=2, environ=env, load=not_read)
    assert (t.threads, t.wait_policy, t.reason, t.wait_reason) == (5, "active", "OMP_NUM_THREADS is set",
                                                                    "OMP_WAIT_POLICY is set")
    assert t.env() == {"OMP_NUM_THREADS": "5", "OMP_WAIT_POLICY": "ACTIVE"}
    # the user's thread count alone: OpenMP's own default wait, as the user had it
    t = decide("auto", 1, cores=4, environ={"OMP_NUM_THREADS": "2"}, load=not_read)
    assert (t.threads, t.wait_policy) == (2, None) and t.env() == {"OMP_NUM_THREADS": "2"}
    # a user's wait policy is kept when ftune picks the count, whatever the load
    assert decide("auto", 1, cores=4, environ={"OMP_WAIT_POLICY": "PASSIVE"}, load=not_read).wait_policy == "passive"
    assert decide("auto", 1, cores=4, environ={"OMP_WAIT_POLICY": "ACTIVE"}, load=not_read).wait_policy == "active"
    # values OpenMP doesn't know are not passed on: the load decides
    assert decide("auto", 1, cores=4, environ={"OMP_WAIT_POLICY": "x"}, load=loaded).wait_policy == "passive"
    assert decide("auto", 1, cores=4, environ={"OMP_NUM_THREADS": "zero"}, load=idle).threads == 4


def test_reading_the_load():
    """Ticks of the CPUs in the affinity between two /proc/stat snapshots: idle and iowait aren't busy."""
    before = ("cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 100 0 0 900 0 0 0 0 0 0\ncpu1 0 0 0 1000 0 0 0 0 0 0\n"
              "cpu2 0 0 0 0 0 0 0 0 0 0\nintr 1 2 3\n")
    after = ("cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 120 0 5 970 0 0 0 0 0 0\ncpu1 25 0 0 1045 30 0 0 0 0 0\n"
             "cpu2 500 0 0 0 0 0 0 0 0 0\nintr 1 2 3\n")
    # cpu0: 25 busy of 95 ticks, cpu1: 25 busy of 100 (30 of them iowait); cpu2 is outside the affinity
    assert threads.load_between(before, after, {0, 1}) == CpuLoad(cpus=2, busy=round(2 * 50 / 195, 2))
    assert threads.load_between(before, after, {2}) == CpuLoad(cpus=1, busy=1.0)
    assert threads.load_between(before, before, {0, 1}) is None  # no tick passed: no reading
    reading = threads.read_load(0.05)  # this machine's: only its shape is asserted
    assert reading is None or (reading.cpus >= 1 and 0 <= reading.busy <= reading.cpus + 0.01
                               and reading.load_average >= 0)


def test_recorded_in_the_plan_and_the_worker_env(tmp_path, monkeypatch):
    """compile_plan: the decision goes into plan.cpu_threads and the workers' environment."""
    from ftune.plan.compile import compile_plan
    from ftune.recipe import load_recipe
    from tests.unit.test_plan_compile import _recipe

    recipe = _recipe(tmp_path)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(threads, "physical_cores", lambda: 2)
    monkeypatch.setattr(threads, "read_load", lambda: CpuLoad(cpus=2, busy=1.9))
    plan = compile_plan(load_recipe(recipe), check_inputs=False)
    assert plan.cpu_threads == CpuThreads(threads=2, wait_policy="passive", reason="2 physical cores / 1 process",
                                          wait_reason="1.90 of 2 CPUs busy at launch: no room for 2 spinning threads",
                                          load=CpuLoad(cpus=2, busy=1.9))
    assert plan.launch.env["OMP_NUM_THREADS"] == "2" and plan.launch.env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert '"cpu_threads":{"threads":2,"wait_policy":"passive"' in plan.model_dump_json()
    assert '"load":{"cpus":2,"busy":1.9,"load_average":null,"looked_again":false}' in plan.model_dump_json()
    monkeypatch.setattr(threads, "read_load", lambda: CpuLoad(cpus=2, busy=0.0))
    plan = compile_plan(load_recipe(recipe), check_inputs=False)
    assert plan.cpu_threads.wait_reason == "0.00 of 2 CPUs busy at launch: room for 2 threads"
    assert plan.launch.env["OMP_NUM_THREADS"] == "2" and "OMP_WAIT_POLICY" not in plan.launch.env
    plan = compile_plan(load_recipe(recipe, ["train.threads=1"]), check_inputs=False)
    assert (plan.cpu_threads.threads, plan.cpu_threads.reason) == (1, "train.threads")
    assert "OMP_WAIT_POLICY" not in plan.launch.env


def test_cuda_runs_get_the_cores_too(tmp_path, monkeypatch):
    """On CUDA accelerate's default is 1 thread per process, which made an H200 LoRA run 0.58-0.68x a plain script
    (docs/performance.md): the plan decides there as on CPU; a plan for other machines (`gpus=`) leaves it to them."""
    from ftune.plan import accelerate
    from ftune.plan.compile import compile_plan
    from ftune.recipe import load_recipe
    from tests.unit.test_plan_compile import _recipe

    recipe = _recipe(tmp_path)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(threads, "physical_cores", lambda: 16)
    monkeypatch.setattr(threads, "read_load", lambda: CpuLoad(cpus=32, busy=3.0))
    real = accelerate.resolve_num_processes
    monkeypatch.setattr(accelerate, "resolve_num_processes", lambda dist, gpus: (1, "cuda") if gpus is None
                        else real(dist, gpus))
    plan = compile_plan(load_recipe(recipe), check_inputs=False)
    assert plan.device == "cuda"
    assert (plan.cpu_threads.threads, plan.cpu_threads.wait_policy, plan.cpu_threads.reason) == (
        16, None, "16 physical cores / 1 process")
    assert plan.launch.env["OMP_NUM_THREADS"] == "16"
    other = compile_plan(load_recipe(recipe), check_inputs=False, gpus=8)
    assert other.cpu_threads is None and "OMP_NUM_THREADS" not in other.launch.env
