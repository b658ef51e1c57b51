"""eval.benchmarks under DDP: two processes (gloo on CPU) measure the live LoRA model at the start and the end, every
rank taking part, rank 0 writing; the numbers equal a one-process run over the same global batch (2 x 2 vs 1 x 4)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.distributed.test_runs import LORA, STEPS, recipe
from tests.e2e._util import ftune, metrics, write_recipe
from tests.e2e.test_benchmarks import TASKS, task_folder

pytestmark = [pytest.mark.distributed, pytest.mark.extended,
              pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None,
                                 reason='needs the lm-eval harness: pip install "ftune[eval]"')]


def test_ddp_benchmarks_equal_one_process(tmp_path, tiny_model_dir, text_data_file):
    tasks = task_folder(tmp_path / "tasks", TASKS / "colors.jsonl")
    bench = {"benchmarks": {"tasks": ["ftune_colors_mc"], "include": [str(tasks)], "limit": 12,
                            "at": ["start", "end"]}}
    measured = {}
    for name, distributed, batch in (("one", {"strategy": "none", "num_processes": 1}, 4),
                                     ("ddp", {"strategy": "ddp", "num_processes": 2}, 2)):
        r = recipe(tiny_model_dir, text_data_file, tmp_path / name, LORA, distributed, batch, eval=bench)
        r["checkpoint"] = {"strategy": "no"}
        result = ftune("run", str(write_recipe(tmp_path, r, f"{name}.yaml")), cwd=tmp_path, timeout=900)
        assert result.code == 0, result.text
        rows = [m for m in metrics(tmp_path / name) if "bench_at" in m]
        assert [(m["bench_at"], m["step"]) for m in rows] == [("start", 0), ("end", STEPS)]  # rank 0 alone writes
        measured[name] = [{k: v for k, v in m.items() if k.startswith("bench/")} for m in rows]
        summary = json.loads((tmp_path / name / "summary.json").read_text())["benchmarks"]
        assert summary["end_step"] == STEPS
    assert measured["ddp"][0] == measured["one"][0]  # the start: the same base model and a zero LoRA update
    for key, value in measured["one"][1].items():  # the end: LoRA weights equal within 1e-5 (test_runs.py)
        assert measured["ddp"][1][key] == pytest.approx(value, abs=0.005), key
