"""After training, through the real CLI on one tiny LoRA run (and one QLoRA run): generation metrics at the end of
`ftune run` and in `ftune eval`; `ftune merge` verified and loadable without peft; `ftune generate` deterministic
on the adapter, the merged folder and the QLoRA adapter; `ftune chat` driven through stdin; a failed merge
leaves nothing that looks finished."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e._util import base_recipe, ftune, metrics, write_recipe

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
GENERATE = {"max_new_tokens": 4, "metrics": ["exact_match", "f1"], "max_samples": 20}
PROMPTS = ("add 2 and 3", "add 7 and 1", "add 4 and 4")


def _train(folder: Path, model_dir: Path, data_file: Path, **sections) -> Path:
    recipe = base_recipe(model_dir, data_file, name=folder.name,
                         data={"train": [{"path": str(data_file), "format": "instruction", "template": "{instruction} ="}], "eval": {"split": 0.1},
                               "max_seq_length": 64},
                         eval={"strategy": "no", "generate": GENERATE},
                         checkpoint={"strategy": "no"}, output={"dir": "runs/r", "report_to": ["none"],
                                                                "loss_curve": False}, **sections)
    path = write_recipe(folder, recipe)
    res = ftune("run", str(path), cwd=folder)
    assert res.code == 0, res.text
    return folder / "runs" / "r"


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, tiny_model_dir, instruction_data_file) -> Path:
    return _train(tmp_path_factory.mktemp("lora"), tiny_model_dir, instruction_data_file,
                  train={"max_steps": 40, "learning_rate": 3e-2})


@pytest.fixture(scope="module")
def merged(lora_run) -> dict:
    res = ftune("merge", str(lora_run), "--dtype", "float32", "--shard-size", "100KB", "--format", "json",
                cwd=lora_run)
    assert res.code == 0, res.text
    return json.loads(res.out)


def _generate(target: Path, *extra: str) -> dict:
    args = [a for p in PROMPTS for a in ("--prompt", p)]
    res = ftune("generate", str(target), *args, "--max-new-tokens", "6", "--format", "json", *extra, cwd=target)
    assert res.code == 0, res.text
    return json.loads(res.out)


def test_generation_metrics_at_the_end_of_the_run_and_in_eval(lora_run):
    logged = [m for m in metrics(lora_run) if "eval_exact_match" in m]
    assert len(logged) == 1
    assert 0.0 <= logged[0]["eval_exact_match"] <= 1.0 and 0.0 <= logged[0]["eval_f1"] <= 1.0
    assert logged[0]["eval_f1"] >= logged[0]["eval_exact_match"]
    assert logged[0]["eval_generated"] == 20
    res = ftune("eval", str(lora_run.parents[1] / "recipe.yaml"), "--format", "json", cwd=lora_run.parents[1])
    assert res.code == 0, res.text
    measured = json.loads(res.out)["metrics"]
    # greedy decoding of the same model on the same prompts: the same answers
    assert measured["eval_exact_match"] == logged[0]["eval_exact_match"]
    assert measured["eval_f1"] == pytest.approx(logged[0]["eval_f1"])
    assert measured["eval_perplexity"] == pytest.approx(2.718281828 ** measured["eval_loss"], rel=1e-6)
