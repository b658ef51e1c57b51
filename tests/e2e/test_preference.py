"""DPO + LoRA through `ftune run` on the tiny model: the held-out preference accuracy rises to >= 0.9, the reward
margin grows, metrics.jsonl holds TRL's preference metrics, and final/ reloads as a plain single adapter."""

from __future__ import annotations

import json
import random

import pytest

from tests.conftest import WORDS
from tests.e2e._util import base_recipe, ftune, metrics, write_recipe

pytestmark = [pytest.mark.slow, pytest.mark.skipif(__import__("importlib").util.find_spec("trl") is None,
                                                   reason="needs trl (pip install 'ftune[preference]')")]


def preference_rows(n: int, seed: int) -> list[dict]:
    """A learnable rule: the chosen answer opens with `yes`, the rejected one with `no`, the rest is the same."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        words = " ".join(rng.choice(WORDS) for _ in range(4))
        rows.append({"prompt": f"User: {words}\nAssistant:", "chosen": f" yes {words}", "rejected": f" no {words}"})
    return rows


def test_dpo_lora_learns_the_preference_and_saves_one_adapter(tmp_path, tiny_model_dir):
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in preference_rows(200, seed=5)))
    recipe = base_recipe(
        tiny_model_dir, data,
        data={"train": [{"path": str(data), "format": "preference"}], "eval": {"split": 0.15}},
        train={"objective": "dpo", "max_steps": 16, "logging_steps": 4, "preference": {"beta": 0.1}},
        eval={"strategy": "steps", "steps": 16, "on_start": True},
        checkpoint={"strategy": "steps", "steps": 16, "keep": 1},
    )
    res = ftune("run", str(write_recipe(tmp_path, recipe)), cwd=tmp_path)
    assert res.code == 0, res.text
    run = tmp_path / "runs" / "e2e"
    records = metrics(run)
    evals = [r for r in records if "eval_rewards/accuracies" in r]
    start, end = evals[0], evals[-1]
    assert start["step"] == 0 and start["eval_rewards/accuracies"] <= 0.5  # policy == reference: no preference yet
    assert end["eval_rewards/accuracies"] >= 0.9
    assert end["eval_rewards/margins"] > start["eval_rewards/margins"] + 0.05
    assert end["eval_loss"] < start["eval_loss"] - 0.02  # DPO loss starts at log 2
    train = [r for r in records if "rewards/chosen" in r and "loss" in r]
    assert train[-1]["loss"] < train[0]["loss"] and {"rewards/rejected", "rewards/margins"} <= set(train[-1])

    final = run / "final"
    assert (final / "adapter_config.json").is_file() and not (final / "ref").exists()  # TRL's ref copy dropped
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(final))
    assert list(model.peft_config) == ["default"]
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert lora_b and all(float(p.abs().sum()) > 0 for p in lora_b)  # trained, not the zero init
