"""`ftune run` under stress: secrets never land on disk, bad input is refused before anything is written,
`--dry-run` trains nothing, Ctrl-C leaves a resumable run dir (SIGKILL/SIGTERM + resume: tests/faults/)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.e2e._util import base_recipe, ftune, write_recipe
from tests.held import start_held, wait_held

pytestmark = pytest.mark.slow


def _resume_recipe(tiny_model_dir, text_data_file, out: str) -> dict:
    return base_recipe(
        tiny_model_dir, text_data_file, name="resume",
        peft={"method": "lora", "r": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["q_proj", "v_proj"]},
        train={"max_steps": 16, "learning_rate": 1e-2, "per_device_batch_size": 4, "logging_steps": 2},
        eval={"strategy": "no"},
        data={"train": [{"path": str(text_data_file), "format": "text"}], "eval": None, "max_seq_length": 48},
        checkpoint={"strategy": "steps", "steps": 4, "keep": None, "resume": "auto"},
        output={"dir": out, "report_to": ["none"]},
    )


def test_secrets_are_masked_everywhere(tmp_path, tiny_model_dir, text_data_file):
    secret = "hf_SuperSecretValue_12345"
    recipe = base_recipe(tiny_model_dir, text_data_file, name="secret",
                         train={"max_steps": 2, "logging_steps": 1}, eval={"strategy": "no"},
                         checkpoint={"strategy": "no"}, output={"dir": "runs/secret", "report_to": ["tensorboard"]})
    recipe["model"]["hub_token"] = "${env:HF_TOKEN}"
    recipe["description"] = "key ${env:MY_API_KEY,none}"
    path = write_recipe(tmp_path, recipe)
    env = {"HF_TOKEN": secret, "MY_API_KEY": secret}
    dry = ftune("run", str(path), "--dry-run", cwd=tmp_path, env=env)
    assert dry.code == 0, dry.text
    assert secret not in dry.text
    res = ftune("run", str(path), cwd=tmp_path, env=env)
    assert res.code == 0, res.text
    assert secret not in res.text
    run_dir = tmp_path / "runs" / "secret"
    leaked = [p for p in run_dir.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert leaked == []
    assert "***" in (run_dir / "recipe.resolved.yaml").read_text()
    assert json.loads((run_dir / "plan.json").read_text())["secrets"]["model.hub_token"] == "HF_TOKEN"
    show = ftune("show", str(path), cwd=tmp_path, env=env)
    assert secret not in show.text


def test_dry_run_prints_plan_and_command_and_writes_nothing(tmp_path, tiny_model_dir, text_data_file):
    path = write_recipe(tmp_path, base_recipe(tiny_model_dir, text_data_file))
    res = ftune("run", str(path), "--dry-run", "train.max_steps=7", cwd=tmp_path)
    assert res.code == 0, res.text
    assert "accelerate" in res.out and "--config_file" in res.out and "ftune.worker" in res.out
    assert str(tmp_path / "runs" / "e2e" / "plan.json") in res.out
    assert '"max_steps": 7' in res.out
    assert not (tmp_path / "runs").exists()


def _assert_clean_error(res, *needles):
    assert res.code == 1, res.text
    assert "Traceback" not in res.text
    for needle in needles:
        assert needle in res.err, res.err


def test_bad_inputs_are_refused_before_anything_is_written(tmp_path, tiny_model_dir, text_data_file):
    path = write_recipe(tmp_path, base_recipe(tiny_model_dir, text_data_file))

    res = ftune("run", str(path), "model.path=./no-such-model", cwd=tmp_path)
    _assert_clean_error(res, "model folder not found: ./no-such-model", "model.path", "hint:")

    res = ftune("run", str(path), f"data.train=[{{path: missing.jsonl, format: text}}]", cwd=tmp_path)
    _assert_clean_error(res, "data file not found: missing.jsonl", "data.train[0].path")

    (tmp_path / "afile").write_text("x")
    res = ftune("run", str(path), "output.dir=afile/run", cwd=tmp_path)
    _assert_clean_error(res, "cannot write the run directory", "output.dir")

    res = ftune("run", str(path), "peft.target_modules=[qq_proj]", cwd=tmp_path)
    _assert_clean_error(res, "peft.target_modules", "q_proj", "k_proj")  # lists the available names

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    res = ftune("run", str(path), f"data.train=[{{path: {empty}, format: text}}]", cwd=tmp_path)
    assert res.code != 0 and "Traceback" not in res.text, res.text
    assert "empty" in res.err.lower()

    assert not (tmp_path / "runs").exists()  # nothing half-written by any refused run


def test_ctrl_c_leaves_a_resumable_run_dir(tmp_path, tiny_model_dir, text_data_file):
    """Held after step 4 (checkpoint-4 saved and marked) of a 5-step run: without the hold the run would end one
    step later, on any CPU; with it, Ctrl-C provably lands mid-run."""
    recipe = _resume_recipe(tiny_model_dir, text_data_file, "runs/interrupted")
    recipe["train"]["max_steps"] = 5
    path = write_recipe(tmp_path, recipe, "interrupted.yaml")
    proc = start_held(path, tmp_path, 4, tmp_path / "hold")
    assert wait_held(proc, tmp_path / "hold") == 4
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "rerun the same command" in err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    run_dir = tmp_path / "runs/interrupted"
    assert not (run_dir / "final").exists()
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["recipe"]["train"]["max_steps"] == 5
    # Every checkpoint that exists is either complete (marked, verified) or ignored by resume.
    from ftune.rundir import RunDir

    latest = RunDir(run_dir).latest_complete_checkpoint()
    assert latest is not None and (latest / "adapter_model.safetensors").is_file()
    assert latest.name == "checkpoint-4"  # where the run was held: nothing after it completed

    # Resumed where max_steps says training ends (a run stopped after its last checkpoint): no step past it.
    # transformers 5.23 trained one more (checkpoint-4 of a 4-step run ended as a 5-step run with checkpoint-5).
    step = int(latest.name.rsplit("-", 1)[1])
    before = len((run_dir / "metrics.jsonl").read_text().splitlines())
    res = subprocess.run([sys.executable, "-m", "ftune.cli.main", "run", str(path), f"train.max_steps={step}"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (run_dir / "final" / "ftune_complete.json").is_file()
    logged = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()[before:]]
    assert logged and max(logged) == step, logged  # the resumed start logged its end at `step`, no step after it
    assert not (run_dir / "checkpoints" / f"checkpoint-{step + 1}").exists()
