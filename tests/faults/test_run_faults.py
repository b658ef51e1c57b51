"""Runtime faults through the real CLI (slow: tiny training). One reference run is shared by the module.
Each test asserts the exit code, the message, and that nothing was lost."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.e2e._util import base_recipe, ftune, write_recipe
from tests.held import release, start_held, wait_held

pytestmark = pytest.mark.slow
MAX_STEPS = 20
CHECKPOINT_EVERY = 5
# Where each launch of the `interrupted` chain is held before its signal: after step 7 (between checkpoints: SIGTERM
# saves step 8), after checkpoint-10, after checkpoint-15; the last rerun trains to 20.
TERM_AT, ORPHAN_AT, GROUP_AT = 7, 10, 15


def _recipe(model, data, out: str, **train) -> dict:
    return base_recipe(
        model, data, name="faults",
        peft={"method": "lora", "r": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["q_proj", "v_proj"]},
        train={"max_steps": MAX_STEPS, "learning_rate": 1e-2, "per_device_batch_size": 4, "logging_steps": 2, **train},
        eval={"strategy": "no"},
        data={"train": [{"path": str(data), "format": "text"}], "eval": None, "max_seq_length": 48},
        checkpoint={"strategy": "steps", "steps": CHECKPOINT_EVERY, "keep": None, "resume": "auto"},
        output={"dir": out, "report_to": ["none"]},
    )


def _tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_model_dir, text_data_file) -> Path:
    """An uninterrupted run: what every interrupted-and-resumed run must reproduce bit for bit."""
    work = tmp_path_factory.mktemp("faults")
    path = write_recipe(work, _recipe(tiny_model_dir, text_data_file, "runs/ref"), "ref.yaml")
    res = ftune("run", str(path), cwd=work)
    assert res.code == 0, res.text
    return work / "runs/ref"


def _workers_of(plan_file: Path) -> list[int]:
    """Live processes whose command line names this run's plan (accelerate and the worker)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes()
                state = (proc / "stat").read_text().rpartition(")")[2].split()[0]
            except OSError:
                continue
            if str(plan_file).encode() in cmd and state != "Z":
                found.append(int(proc.name))
    return found


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory, tiny_model_dir, text_data_file) -> dict:
    """One run, interrupted three ways in turn by the same command rerun each time (resume: auto), then finished:
    SIGTERM to ftune while held after step TERM_AT; SIGKILL to ftune alone while held after checkpoint ORPHAN_AT;
    SIGKILL to the whole group while held after checkpoint GROUP_AT; a last rerun to the end. Each launch is held
    at its step (ftune/worker/hold.py) before the signal, so where it lands never depends on the CPU's speed. The
    tests below read it (one run instead of three: the launches and steps they repeated cost about a third of this
    module's time)."""
    work = tmp_path_factory.mktemp("interrupted")
    path = write_recipe(work, _recipe(tiny_model_dir, text_data_file, "runs/chain"), "chain.yaml")
    run, hold = work / "runs/chain", work / "hold"
    out: dict = {"work": work, "run": run, "plan": run / "plan.json"}

    proc = start_held(path, work, TERM_AT, hold)
    out["term"] = {"held": wait_held(proc, hold)}
    os.kill(proc.pid, signal.SIGTERM)  # the ftune process only, as a supervisor does
    _, err = proc.communicate(timeout=120)
    out["term"] |= {"code": proc.returncode, "err": err, "final": (run / "final").exists(),
                    "workers": _workers_of(out["plan"])}
    step = int(err.split("stopped by SIGTERM at step ")[1].split(";")[0]) if "stopped by SIGTERM at step " in err \
        else None
    out["term"]["step"] = step
    assert step == TERM_AT + 1, err  # the step under way when the signal came is finished and saved

    proc = start_held(path, work, ORPHAN_AT, hold)  # resumes from the SIGTERM checkpoint
    wait_held(proc, hold)
    out["term"]["resume_from"] = json.loads(out["plan"].read_text())["resume_from"]
    workers = _workers_of(out["plan"])
    os.kill(proc.pid, signal.SIGKILL)  # no handler runs: the kernel tells the children
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 20  # bounds the kernel's delivery, decides nothing
    while _workers_of(out["plan"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    lines = (run / "metrics.jsonl").read_text()
    release(hold)  # an orphan that survived would train on from here and log
    time.sleep(1.0)
    out["orphan"] = {"pid": proc.pid, "workers_before": workers, "workers_after": _workers_of(out["plan"]),
                     "metrics_still": (run / "metrics.jsonl").read_text() == lines, "final": (run / "final").exists()}
    from ftune.launch.lock import acquire
    from ftune.rundir import RunDir

    with acquire(RunDir(run), "ftune run") as lock:  # a rerun takes the dead run's lock over
        out["orphan"]["took_over"] = lock.took_over

    proc = start_held(path, work, GROUP_AT, hold)
    wait_held(proc, hold)
    os.killpg(proc.pid, signal.SIGKILL)  # launcher, accelerate and the worker
    proc.communicate(timeout=30)
    out["group"] = {"final": (run / "final").exists()}

    res = ftune("run", str(path), cwd=work)  # same command: checkpoint.resume=auto continues
    out["group"] |= {"res": res, "resume_from": json.loads(out["plan"].read_text())["resume_from"],
                     "killed_at": GROUP_AT}
    return out


def _same_final(reference: Path, run: Path) -> None:
    a, b = _tensors(reference / "final"), _tensors(run / "final")
    assert a.keys() == b.keys() and len(a) > 0
    assert all(bool((a[k] == b[k]).all()) for k in a), "resumed run differs from the uninterrupted one"


def test_sigterm_to_ftune_saves_the_current_step_and_resumes_bit_identical(interrupted, reference):
    term, run = interrupted["term"], interrupted["run"]
    err, step = term["err"], term["step"]
    assert term["code"] == 143, err
    assert "stopped by SIGTERM at step" in err and "rerun the same command to resume" in err
    assert "Traceback" not in err and err.count("error:") == 1
    assert term["held"] == TERM_AT and step == TERM_AT + 1, err
    assert (run / f"checkpoints/checkpoint-{step}/ftune_complete.json").is_file()
    assert not term["final"] and term["workers"] == []
    assert term["resume_from"].endswith(f"checkpoint-{step}")  # the rerun resumed from the SIGTERM checkpoint
    assert interrupted["group"]["res"].code == 0, interrupted["group"]["res"].text
    _same_final(reference, run)


def test_resume_after_sigkill_of_the_group_is_bit_identical(interrupted, reference):
    """SIGKILL to the whole group mid-training (no handler runs): a rerun resumes from the latest complete
    checkpoint and ends bit-identical to the uninterrupted reference."""
    group, run = interrupted["group"], interrupted["run"]
    assert not group["final"]
    assert group["res"].code == 0, group["res"].text
    assert "checkpoint-" in group["resume_from"]
    assert int(group["resume_from"].rsplit("-", 1)[1]) == group["killed_at"]  # held after that checkpoint
    _same_final(reference, run)


def test_sigkill_of_ftune_alone_stops_its_workers(interrupted):
    orphan = interrupted["orphan"]
    assert orphan["workers_before"]
    assert orphan["workers_after"] == [], "an orphan kept training"
    assert orphan["metrics_still"] and not orphan["final"]
    assert orphan["took_over"] is not None and orphan["took_over"]["pid"] == orphan["pid"]


@pytest.mark.parametrize("speed", ["fast", pytest.param("slow", marks=pytest.mark.extended)])
def test_sigterm_lands_at_the_held_step_whatever_the_speed(tmp_path, tiny_model_dir, text_data_file, speed):
    """fast: a 3-step run of a few milliseconds a step, held after step 1, which no test could signal in time by
    watching files; slow: every step sleeps 0.5 s (FTUNE_STEP_DELAY). Both stop where they were held."""
    recipe = _recipe(tiny_model_dir, text_data_file, "runs/speed", max_steps=3, per_device_batch_size=1)
    recipe["checkpoint"] = {"strategy": "no"}
    recipe["data"]["max_seq_length"] = 16
    path = write_recipe(tmp_path, recipe, "speed.yaml")
    proc = start_held(path, tmp_path, 1, tmp_path / "hold", delay=0.5 if speed == "slow" else None)
    assert wait_held(proc, tmp_path / "hold") == 1
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "stopped by SIGTERM at step 2;" in err, err  # mid-run: step 2 of 3, saved though checkpoints are off
    run = tmp_path / "runs/speed"
    assert (run / "checkpoints/checkpoint-2/ftune_complete.json").is_file() and not (run / "final").exists()


def test_nonfinite_loss_stops_the_run_and_saves_nothing_nonfinite(tmp_path, tiny_model_dir, text_data_file):
    recipe = _recipe(tiny_model_dir, text_data_file, "runs/nan", learning_rate=1e12, max_grad_norm=0,
                     logging_steps=5, optimizer="sgd", max_steps=12)
    recipe["peft"] = {"method": "full"}  # the fault corpus's case: full fine-tune, SGD, lr 1e12, no clipping
    recipe["checkpoint"]["steps"] = 3  # checkpoints between logging steps are checked too
    path = write_recipe(tmp_path, recipe, "nan.yaml")
    res = ftune("run", str(path), cwd=tmp_path)
    assert res.code == 4, res.text
    assert "training stopped at step" in res.err and "not finite" in res.err and "learning_rate" in res.err
    assert "Traceback" not in res.text and "loss 0.0000" not in res.out and "→ 0.0000" not in res.out
    run = tmp_path / "runs/nan"
    assert not (run / "final").exists()
    from ftune.rundir import RunDir

    for ck in RunDir(run).complete_checkpoints():  # any checkpoint marked complete holds finite weights
        assert all(bool(t.isfinite().all()) for t in _tensors(ck).values())


def test_second_run_and_eval_on_a_live_run_dir_are_refused(tmp_path, reference, tiny_model_dir, text_data_file):
    from ftune.launch.lock import acquire
    from ftune.rundir import RunDir

    run = tmp_path / "runs/ref"
    shutil.copytree(reference, run)
    path = write_recipe(tmp_path, _recipe(tiny_model_dir, text_data_file, "runs/ref", learning_rate=1e-3), "b.yaml")
    before = (run / "plan.json").read_bytes()
    with acquire(RunDir(run), "ftune run"):
        res = ftune("run", str(path), "output.overwrite=true", cwd=tmp_path)
        assert res.code == 5, res.text
        assert f"in use by ftune run (pid {os.getpid()} on " in res.err and "since" in res.err
        res = ftune("eval", str(path), cwd=tmp_path)
        assert res.code == 5 and "in use by ftune run" in res.err, res.text
        res = ftune("merge", str(run), cwd=tmp_path)
        assert res.code == 5 and "in use by ftune run" in res.err, res.text
        assert not (run / "merged").exists()
    assert (run / "plan.json").read_bytes() == before and (run / "final/ftune_complete.json").is_file()
