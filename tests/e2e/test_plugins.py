"""Plugins without forking: a package (tests/data/plugin, put on PYTHONPATH with its dist-info, as pip would
install it) registers a callback, a data format, a PEFT method and an objective; a recipe names all four;
`validate` knows them (and suggests near matches), and a real run uses them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from tests.e2e._util import ftune, losses

PLUGIN = Path(__file__).resolve().parents[1] / "data" / "plugin"


def _env() -> dict:
    return {"PYTHONPATH": os.pathsep.join([str(PLUGIN), os.environ.get("PYTHONPATH", "")])}


def _recipe(tmp_path, tiny_model_dir, **train) -> Path:
    data = tmp_path / "qa.jsonl"
    rows = [{"question": f"what is {i} plus one", "answer": f"{i + 1}"} for i in range(60)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = {"name": "plugged", "model": {"path": str(tiny_model_dir), "dtype": "float32"},
         "data": {"train": [{"path": str(data), "format": "qa"}], "max_seq_length": 32},
         "peft": {"method": "embed-only"},
         "train": {"max_steps": 6, "learning_rate": 1e-2, "per_device_batch_size": 8, "logging_steps": 1,
                   "callbacks": [{"name": "step-log", "args": {"every": 2}}], **train},
         "checkpoint": {"strategy": "no"},
         "output": {"dir": str(tmp_path / "run"), "report_to": ["none"], "loss_curve": False}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(r, sort_keys=False))
    return path


def test_validate_knows_installed_plugins(tmp_path, tiny_model_dir):
    path = _recipe(tmp_path, tiny_model_dir)
    assert ftune("validate", str(path), cwd=tmp_path, env=_env()).code == 0
    without = ftune("validate", str(path), cwd=tmp_path)  # the plugin not installed: every name is refused
    assert without.code == 1
    assert "data.train[0].format: invalid value 'qa'" in without.text  # the schema's choices include plugins'
    assert "embed-only" in without.text and "methods: lora, prefix, llama-adapter, full, freeze" in without.text
    bad = yaml.safe_load(path.read_text())
    bad["train"]["objective"] = "counted-sf"
    path.write_text(yaml.safe_dump(bad, sort_keys=False))
    res = ftune("validate", str(path), cwd=tmp_path, env=_env())
    assert res.code == 1 and "train.objective: invalid value 'counted-sf'" in res.text and "counted-sft" in res.text
    bad = yaml.safe_load(path.read_text())
    bad["train"]["callbacks"] = [{"name": "step-logg", "args": {"every": 0}}, {"name": "step-log", "args": {"every": 0}}]
    path.write_text(yaml.safe_dump(bad, sort_keys=False))
    res = ftune("validate", str(path), cwd=tmp_path, env=_env())
    assert res.code == 1
    assert "train.callbacks[0].name: no installed plugin registers a callback named 'step-logg'" in res.text
    assert "did you mean 'step-log'?" in res.text
    assert "train.callbacks[1].args.every: callback 'step-log': Input should be greater than 0" in res.text
    assert "recipe.yaml:" in res.text  # located


@pytest.mark.slow
def test_a_run_uses_the_plugin_callback_format_method_and_objective(tmp_path, tiny_model_dir):
    path = _recipe(tmp_path, tiny_model_dir, objective="counted-sft")
    res = ftune("run", str(path), cwd=tmp_path, env=_env())
    assert res.code == 0, res.text[-3000:]
    assert (tmp_path / "steps.log").read_text().split() == ["2", "4", "6"]  # the callback ran
    assert (tmp_path / "objective.log").read_text().split() == ["loss"] * 6  # the objective's trainer, each step
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert (plan["family"], plan["trainer_class"]) == ("sft", "ftune_testplugin.objective.CountingTrainer")
    curve = losses(tmp_path / "run")
    assert curve[-1] < curve[0]
    params = json.loads((tmp_path / "run" / "params.json").read_text())
    assert params["trainable"] == 384 * 64  # embed-only: the tiny Llama's embedding matrix alone
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()  # a full model, as the method says
