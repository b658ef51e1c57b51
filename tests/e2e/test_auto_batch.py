"""`ftune run` with `global_batch_size` and `per_device_batch_size: auto` / `gradient_checkpointing: auto`: the plan
sizes the micro-batch, and the optimizer's batch is the recipe's whatever it picks: the same losses as the same
global batch split by hand into 4 micro-batches of 4 with checkpointing."""

from __future__ import annotations

import json

import pytest

from tests.e2e._util import base_recipe, ftune, losses, write_recipe

pytestmark = pytest.mark.slow


def test_auto_micro_batch_trains_the_same_optimizer_batch(tmp_path, tiny_model_dir, text_data_file):
    def run(name: str, **train) -> tuple[dict, list[float]]:
        recipe = base_recipe(tiny_model_dir, text_data_file, name=name,
                             train={"max_steps": 3, "logging_steps": 1, "per_device_batch_size": 1, **train},
                             output={"dir": f"runs/{name}"})
        recipe["eval"] = {"strategy": "no"}
        recipe["checkpoint"] = {"strategy": "no"}
        recipe["data"].pop("eval")
        result = ftune("run", str(write_recipe(tmp_path, recipe, f"{name}.yaml")), cwd=tmp_path)
        assert result.code == 0, result.text
        plan = json.loads((tmp_path / "runs" / name / "plan.json").read_text())
        return plan, losses(tmp_path / "runs" / name)

    auto, auto_losses = run("auto", global_batch_size=16, per_device_batch_size="auto",
                                  gradient_checkpointing="auto")
    # this CPU: 16 rows of 64 tokens (1,024 tokens, full speed on a CPU by the plan's step model) fit in half its RAM
    t = auto["recipe"]["train"]
    assert (t["per_device_batch_size"], t["gradient_accumulation_steps"], t["gradient_checkpointing"]) == (16, 1, False)
    assert auto["effective_batch_size"] == 16 and auto["trainer"]["per_device_train_batch_size"] == 16
    [line] = [n for n in auto["notes"] if n.startswith("batch: ")]
    assert line.startswith("batch: 16 row(s) per device x 1 accumulation x 1 rank(s) = global_batch_size 16; "
                           "gradient_checkpointing off (rows that fit in ")

    by_hand, hand_losses = run("hand", global_batch_size=16, per_device_batch_size=4, gradient_checkpointing=True)
    assert by_hand["trainer"]["gradient_accumulation_steps"] == 4 and by_hand["effective_batch_size"] == 16
    assert len(auto_losses) == len(hand_losses) == 3
    assert auto_losses == pytest.approx(hand_losses, abs=1e-4)  # the same rows per step, the same updates
    assert auto_losses[-1] < auto_losses[0]
