"""Run-dir faults, fast (no training): the lock, ownership, overwrite, refused output dirs, resume
compatibility, a truncated checkpoint, the worker's plan digest, error.json. Each asserts the message and
that nothing in the run dir was lost."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ftune.errors import EXIT_BUSY, FtuneError, RecipeError
from ftune.launch import launcher
from ftune.launch.lock import acquire, claim
from ftune.plan.compile import compile_plan
from ftune.recipe import load_recipe
from ftune.rundir import RunDir, mark_complete
from ftune.tiny import CONFIG


def _recipe(tmp_path: Path, out: Path, **extra) -> Path:
    data = {"name": "f", "model": {"path": "m"}, "data": {"train": [{"path": "d.jsonl"}]},
            "peft": {"method": "lora", "r": 8, "target_modules": ["q_proj", "v_proj"]},
            "train": {"max_steps": 8}, "output": {"dir": str(out)}, **extra}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _plan(path: Path, *overrides: str):
    return compile_plan(load_recipe(path, list(overrides)), check_inputs=False)


def _checked(path: Path, *overrides: str) -> list[str]:
    """Problems of the run-dir checks (compile with inputs checked; model/data absence filtered out)."""
    try:
        compile_plan(load_recipe(path, list(overrides)))
    except RecipeError as err:
        return [p.render() for p in err.problems
                if "not found" not in p.message and "not in the Hugging Face cache" not in p.message]
    return []


def _fake_run(root: Path, steps=(4, 8), r: int = 8) -> RunDir:
    """A run dir as an earlier ftune run leaves it: marker, plan.json, marked checkpoints with real headers."""
    from safetensors.numpy import save_file
    import numpy as np

    run = RunDir(root)
    root.mkdir(parents=True)
    run.marker.write_text("{}")
    run.plan.write_text(json.dumps({"recipe": {"model": {"path": "m", "task": "causal-lm"},
                                               "peft": {"method": "lora", "r": r,
                                                        "target_modules": ["q_proj", "v_proj"]},
                                               "data": {"train": [{"path": "d.jsonl"}]}}}))
    for step in steps:
        ck = run.checkpoints / f"checkpoint-{step}"
        ck.mkdir(parents=True)
        save_file({"w": np.ones((4, 4), dtype=np.float32)}, str(ck / "adapter_model.safetensors"))
        (ck / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        mark_complete(ck, {"step": step})
    run.metrics.write_text('{"step": 1, "loss": 1.0}\n')
    return run


def test_second_run_on_a_locked_dir_names_the_holder(tmp_path):
    run = _fake_run(tmp_path / "run")
    before = {p: p.read_bytes() for p in run.root.rglob("*") if p.is_file()}
    with acquire(run, "ftune run"):
        with pytest.raises(FtuneError) as err:
            claim(run, "run")
        assert err.value.exit_code == EXIT_BUSY == 5
        assert f"pid {os.getpid()} on {socket.gethostname()}, since " in err.value.message
        assert "ftune run" in err.value.message and "kill" in err.value.hint
    after = {p: p.read_bytes() for p in run.root.rglob("*") if p.is_file()}
    assert after == before  # nothing written by the refused run (the lock file is gone with its holder)
    assert not run.lock.exists()


def test_lock_is_held_by_a_live_process_across_processes(tmp_path):
    run = _fake_run(tmp_path / "run")
    code = ("import sys,time; from ftune.launch.lock import acquire; from ftune.rundir import RunDir; "
            f"l = acquire(RunDir(__import__('pathlib').Path({str(run.root)!r})), 'ftune run'); "
            "print('held', flush=True); time.sleep(30)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(FtuneError) as err:
            acquire(run, "ftune eval")
        assert f"pid {proc.pid} " in err.value.message
        # the output policy's probe sees the same holder (flock held), takes nothing, and refuses with exit 5
        from ftune import outputs

        assert outputs.lock_holder(run.root)["pid"] == proc.pid
        with pytest.raises(FtuneError) as err:
            outputs.check_output(run.root / "new.yaml", outputs.RECIPE)
        assert err.value.exit_code == 5 and f"in use by ftune run (pid {proc.pid} " in err.value.message
    finally:
        proc.kill()
        proc.wait()
    from ftune import outputs

    assert outputs.lock_holder(run.root) is None  # its process is gone: no holder
    with acquire(run, "ftune eval") as lock:  # the holder died: its lock is stale and taken over
        assert lock.took_over is not None and lock.took_over["pid"] == proc.pid


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
    run = _fake_run(tmp_path / "run")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run.lock.write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "started": "then",
                                    "command": "ftune run"}))
    with acquire(run, "ftune run") as lock:
        assert lock.took_over["pid"] == dead.pid
        assert json.loads(run.lock.read_text())["pid"] == os.getpid()
    assert not run.lock.exists()


def test_lock_from_another_host_is_refused_naming_the_file(tmp_path):
    run = _fake_run(tmp_path / "run")
    run.lock.write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": "then", "command": "ftune run"}))
    with pytest.raises(FtuneError) as err:
        acquire(run, "ftune run")
    assert "elsewhere" in err.value.message and str(run.lock) in err.value.hint


def test_worker_refuses_a_plan_rewritten_after_launch(tmp_path, monkeypatch):
    from ftune.lifecycle import PLAN_DIGEST_ENV
    from ftune.worker.main import load_plan

    plan = _plan(_recipe(tmp_path, tmp_path / "run"))
    file = tmp_path / "plan.json"
    file.write_text(plan.model_dump_json())
    import hashlib

    monkeypatch.setenv(PLAN_DIGEST_ENV, hashlib.sha256(file.read_bytes()).hexdigest())
    assert load_plan(str(file)).run_dir == plan.run_dir
    file.write_text(plan.model_dump_json().replace('"max_steps":8', '"max_steps":9'))
    with pytest.raises(FtuneError, match="changed after this run was launched"):
        load_plan(str(file))


def test_folder_not_created_by_ftune_is_never_touched(tmp_path):
    out = tmp_path / "mine"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "notes.txt").write_text("keep me")
    (out / "metrics.jsonl").write_text("mine\n")
    problems = _checked(_recipe(tmp_path, out), "output.overwrite=true")
    assert any("output.dir" in p and "was not created by ftune" in p for p in problems), problems
    with pytest.raises(FtuneError, match="was not created by ftune"):
        claim(RunDir(out), "run")
    assert (out / "checkpoints" / "notes.txt").read_text() == "keep me"
    assert (out / "metrics.jsonl").read_text() == "mine\n"


@pytest.mark.parametrize("where", ["root", "home", "cwd"])
def test_output_dir_root_home_or_cwd_is_refused(tmp_path, monkeypatch, where):
    monkeypatch.chdir(tmp_path)
    target = {"root": "/", "home": str(Path.home()), "cwd": "."}[where]
    problems = _checked(_recipe(tmp_path, Path(target)))
    expected = {"root": "a filesystem root", "home": "your home directory", "cwd": "the working directory itself"}
    assert any("output.dir" in p and expected[where] in p and "r.yaml:" in p for p in problems), problems


def test_overwrite_starts_fresh_and_removes_only_ftune_outputs(tmp_path, monkeypatch):
    run = _fake_run(tmp_path / "run")
    (run.root / "notes.txt").write_text("mine")
    path = _recipe(tmp_path, run.root)
    assert _plan(path).resume_from == str(run.checkpoints / "checkpoint-8")
    plan = _plan(path, "output.overwrite=true", "train.learning_rate=1e-3")
    assert plan.resume_from is None  # overwrite never resumes

    class Proc:
        pid = -1

        def wait(self, timeout=None):
            return 0

    real = launcher.subprocess.Popen
    monkeypatch.setattr(launcher.subprocess, "Popen",
                        lambda cmd, *a, **k: Proc() if "ftune.worker" in cmd else real(cmd, *a, **k))
    assert launcher.launch(plan, "name: f\n") == 0
    assert not run.checkpoints.exists() and not run.metrics.exists()
    assert (run.root / "notes.txt").read_text() == "mine" and run.marker.is_file()
    assert json.loads(run.plan.read_text())["recipe"]["train"]["learning_rate"] == 1e-3


def test_overwrite_with_resume_true_is_refused(tmp_path):
    run = _fake_run(tmp_path / "run")
    problems = _checked(_recipe(tmp_path, run.root), "output.overwrite=true", "checkpoint.resume=true")
    assert any("checkpoint.resume" in p and "fresh run" in p for p in problems), problems


def test_resume_after_changing_peft_r_is_a_located_refusal(tmp_path):
    run = _fake_run(tmp_path / "run", r=8)
    problems = _checked(_recipe(tmp_path, run.root), "peft.r=4")
    hit = [p for p in problems if "peft.r" in p]
    assert hit and "trained with peft.r = 8" in hit[0] and "says 4" in hit[0], problems
    assert "output.overwrite=true" in hit[0] and "<override>" in hit[0]
    assert _checked(_recipe(tmp_path, run.root), "peft.alpha=32") == []  # alpha changes no shapes
    assert len(list(run.checkpoints.iterdir())) == 2


def test_truncated_latest_checkpoint_falls_back_to_the_previous_one(tmp_path):
    run = _fake_run(tmp_path / "run")
    weights = run.checkpoints / "checkpoint-8" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-20])
    plan = _plan(_recipe(tmp_path, run.root))
    assert plan.resume_from == str(run.checkpoints / "checkpoint-4")
    assert any("checkpoint-8 can't be resumed" in n and "truncated" in n and str(weights) in n for n in plan.notes)
    assert weights.exists()  # kept for inspection, never deleted


def test_truncated_model_weights_name_the_file(tmp_path):
    from safetensors.numpy import save_file
    import numpy as np

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(CONFIG))  # a tiny Llama, no weights
    save_file({"w": np.ones((64, 64), dtype=np.float32)}, str(model / "model.safetensors"))
    data = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").write_bytes(data[: len(data) // 2])
    problems = _checked(_recipe(tmp_path, tmp_path / "run"), f"model.path={model}")
    assert any("model.path" in p and "model.safetensors is truncated" in p for p in problems), problems


def test_error_json_hint_names_only_files_that_exist(tmp_path):
    run = _fake_run(tmp_path / "run")
    run.error.write_text(json.dumps({"kind": "internal", "message": "ValueError: x", "traceback": "T\n  F\n  c\nV"}))
    kept = launcher._worker_error(run, kept=True)
    removed = launcher._worker_error(run, kept=False)
    assert str(run.error) in kept.hint and str(run.error) not in removed.hint and "--debug" in removed.hint
    run.error.write_text("")  # a 0-byte error.json (a disk that filled up) is no internal JSONDecodeError
    assert launcher._worker_error(run, kept=True) is None


def test_error_json_is_written_atomically_or_reported_on_stderr(tmp_path, capsys):
    from ftune.worker.main import _write_error

    run = _fake_run(tmp_path / "run")
    _write_error(run, {"kind": "user", "message": "m", "hint": "h"})
    assert json.loads(run.error.read_text())["message"] == "m"
    assert not list(run.root.glob(".error.json.tmp"))
    gone = RunDir(tmp_path / "no-such-dir")
    _write_error(gone, {"kind": "user", "message": "disk full at X", "hint": "free space"})
    err = capsys.readouterr().err
    assert "disk full at X" in err and "free space" in err and "could not write" in err


def test_disk_full_names_the_path(tmp_path):
    import errno

    from ftune.errors import disk_full

    err = disk_full(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run/metrics.jsonl")),
                    tmp_path)
    assert err is not None and err.exit_code == 3
    assert f"no space left on the device holding {tmp_path / 'run/metrics.jsonl'}" in err.message
    assert "df -h" in err.hint and "checkpoint" in err.hint
    assert disk_full(OSError(errno.EACCES, "Permission denied"), tmp_path) is None
    fd = os.open("/dev/full", os.O_WRONLY)  # a real ENOSPC (the kernel's always-full device)
    try:
        with pytest.raises(OSError) as real:
            os.write(fd, b"x")
    finally:
        os.close(fd)
    assert "no space left on the device holding " + str(tmp_path) in disk_full(real.value, tmp_path).message
