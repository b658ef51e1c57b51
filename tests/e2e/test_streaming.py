"""data.streaming through `ftune run`: 50 steps from 4 JSONL shards with packing, then a run killed mid-way and
rerun, which resumes from its last complete checkpoint and logs the uninterrupted run's losses bit for bit."""

from __future__ import annotations

import json
import os
import signal

import pytest

from ftune.tiny import corpus
from tests.e2e._util import base_recipe, ftune, write_recipe
from tests.held import start_held, wait_held

pytestmark = pytest.mark.slow


def _shards(folder):
    folder.mkdir()
    texts = corpus(400, seed=5)
    for k in range(4):
        (folder / f"shard-{k}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[k::4]))
    return str(folder / "shard-*.jsonl")


def _recipe(tiny_model_dir, pattern, out):
    return base_recipe(
        tiny_model_dir, pattern, name="stream",
        data={"train": [{"path": pattern, "format": "text"}], "eval": None, "max_seq_length": 64, "packing": True,
              "streaming": True},
        train={"max_steps": 50, "learning_rate": 5e-3, "per_device_batch_size": 4, "logging_steps": 1,
               "lr_scheduler": "constant"},
        eval={"strategy": "no"},
        checkpoint={"strategy": "steps", "steps": 10, "keep": None, "resume": "auto"},
        output={"dir": out, "report_to": ["none"], "loss_curve": False},
    )


def _step_losses(run_dir) -> dict[int, float]:
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if "loss" in m:
            out[m["step"]] = m["loss"]
    return out


def test_streaming_trains_from_shards_and_resumes_after_a_kill_identically(tmp_path, tiny_model_dir):
    pattern = _shards(tmp_path / "shards")
    path = write_recipe(tmp_path, _recipe(tiny_model_dir, pattern, "runs/whole"), "whole.yaml")
    whole = ftune("run", str(path), cwd=tmp_path, timeout=600)
    assert whole.code == 0, whole.text
    assert "streaming 4 file(s)" in whole.text and "packed into rows of 64" in whole.text
    losses = _step_losses(tmp_path / "runs/whole")
    assert sorted(losses) == list(range(1, 51))
    assert sum(list(losses.values())[-10:]) / 10 < sum(list(losses.values())[:5]) / 5 - 0.1  # it learns
    assert not any((tmp_path / "runs/whole").glob("**/*.arrow"))  # nothing cached
    plan = json.loads((tmp_path / "runs/whole/plan.json").read_text())
    assert plan["trainer"]["accelerator_config"] == {"dispatch_batches": False}

    path = write_recipe(tmp_path, _recipe(tiny_model_dir, pattern, "runs/killed"), "killed.yaml")
    proc = start_held(path, tmp_path, 20, tmp_path / "hold")  # after checkpoint-20, however fast the CPU
    assert wait_held(proc, tmp_path / "hold") == 20
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    resumed = ftune("run", str(path), cwd=tmp_path, timeout=600)
    assert resumed.code == 0, resumed.text
    again = _step_losses(tmp_path / "runs/killed")
    assert again == losses  # every step, the ones before the kill and the resumed ones, equal to the whole run
