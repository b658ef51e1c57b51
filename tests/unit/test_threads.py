"""The CPU thread decision (ftune.plan.threads): every branch forced, whatever this machine's cores."""

from __future__ import annotations

from ftune.plan.threads import CpuThreads, decide


def test_one_thread_per_core_with_a_passive_wait():
    t = decide("auto", 1, cores=4, environ={})
    assert (t.threads, t.wait_policy) == (4, "passive")
    assert t.env() == {"OMP_NUM_THREADS": "4", "OMP_WAIT_POLICY": "PASSIVE"}
    assert t.describe() == "4 threads per process, passive wait (4 physical cores / 1 process)"


def test_cores_are_divided_among_the_processes():
    assert decide("auto", 2, cores=8, environ={}).threads == 4
    one = decide("auto", 2, cores=2, environ={})
    assert (one.threads, one.wait_policy) == (1, None)  # one thread: nothing waits at a barrier
    assert one.env() == {"OMP_NUM_THREADS": "1"}
    assert one.describe() == "1 thread per process (2 physical cores / 2 processes)"
    assert decide("auto", 4, cores=2, environ={}).threads == 1


def test_the_recipe_overrides_the_default():
    t = decide(3, 1, cores=2, environ={})
    assert (t.threads, t.wait_policy, t.reason) == (3, "passive", "train.threads")
    assert decide(1, 1, cores=8, environ={}).wait_policy is None


def test_the_environment_wins_over_everything():
    env = {"OMP_NUM_THREADS": "5", "OMP_WAIT_POLICY": "active"}
    t = decide(2, 1, cores=2, environ=env)
    assert (t.threads, t.wait_policy, t.reason) == (5, "active", "OMP_NUM_THREADS is set")
    assert t.env() == {"OMP_NUM_THREADS": "5", "OMP_WAIT_POLICY": "ACTIVE"}
    # a user's wait policy is kept when ftune picks the count; values OpenMP doesn't know are not passed on
    assert decide("auto", 1, cores=4, environ={"OMP_WAIT_POLICY": "ACTIVE"}).wait_policy == "active"
    assert decide("auto", 1, cores=4, environ={"OMP_WAIT_POLICY": "x"}).wait_policy == "passive"
    assert decide("auto", 1, cores=4, environ={"OMP_NUM_THREADS": "zero"}).threads == 4


def test_recorded_in_the_plan_and_the_worker_env(tmp_path, monkeypatch):
    """compile_plan: the decision goes into plan.cpu_threads and the workers' environment."""
    from ftune.plan import threads
    from ftune.plan.compile import compile_plan
    from ftune.recipe import load_recipe
    from tests.unit.test_plan_compile import _recipe

    recipe = _recipe(tmp_path)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(threads, "physical_cores", lambda: 2)
    plan = compile_plan(load_recipe(recipe), check_inputs=False)
    assert plan.cpu_threads == CpuThreads(threads=2, wait_policy="passive", reason="2 physical cores / 1 process")
    assert plan.launch.env["OMP_NUM_THREADS"] == "2" and plan.launch.env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert '"cpu_threads":{"threads":2,"wait_policy":"passive"' in plan.model_dump_json()
    plan = compile_plan(load_recipe(recipe, ["train.threads=1"]), check_inputs=False)
    assert (plan.cpu_threads.threads, plan.cpu_threads.reason) == (1, "train.threads")
    assert "OMP_WAIT_POLICY" not in plan.launch.env


def test_cuda_runs_get_the_cores_too(tmp_path, monkeypatch):
    """On CUDA accelerate's default is 1 thread per process, which made an H200 LoRA run 0.58-0.68x a plain script
    (docs/performance.md): the plan decides there as on CPU; a plan for other machines (`gpus=`) leaves it to them."""
    from ftune.plan import accelerate, threads
    from ftune.plan.compile import compile_plan
    from ftune.recipe import load_recipe
    from tests.unit.test_plan_compile import _recipe

    recipe = _recipe(tmp_path)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(threads, "physical_cores", lambda: 16)
    real = accelerate.resolve_num_processes
    monkeypatch.setattr(accelerate, "resolve_num_processes", lambda dist, gpus: (1, "cuda") if gpus is None
                        else real(dist, gpus))
    plan = compile_plan(load_recipe(recipe), check_inputs=False)
    assert plan.device == "cuda"
    assert plan.cpu_threads == CpuThreads(threads=16, wait_policy="passive", reason="16 physical cores / 1 process")
    assert plan.launch.env["OMP_NUM_THREADS"] == "16"
    other = compile_plan(load_recipe(recipe), check_inputs=False, gpus=8)
    assert other.cpu_threads is None and "OMP_NUM_THREADS" not in other.launch.env
