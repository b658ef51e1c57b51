"""One tiny run through `ftune data`, `ftune plan` and `ftune run` using the keys real-world recipes needed at once:
a built-in chat template with instruction rows rendered as chat, added and special tokens, a split slice, PiSSA
initialisation, per-epoch evaluations and checkpoints with early stopping and load-best, a distributed timeout."""

from __future__ import annotations

import json

import pytest

from tests.e2e._util import base_recipe, ftune, metrics, write_recipe

pytestmark = pytest.mark.slow


def test_recipe_with_the_new_keys_validates_plans_and_trains(tmp_path, tiny_model_dir, instruction_data_file):
    recipe = base_recipe(
        tiny_model_dir, instruction_data_file, name="e2e-knobs",
        model={"add_tokens": ["<|im_start|>"], "special_tokens": {"eos_token": "<|im_end|>"}},
        data={"train": [{"path": str(instruction_data_file), "format": "instruction", "as_chat": True,
                         "split": "train[:30%]"}],
              "chat_template": "chatml", "eval": {"split": 0.1}},
        peft={"method": "lora", "r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"],
              "init": "pissa"},
        # tiled_loss: the head (its trained token rows wrapped by peft) and loss in slices, recomputed in backward
        train={"max_steps": None, "epochs": 2, "per_device_batch_size": 9, "early_stopping": {"patience": 5},
               "tiled_loss": True},
        distributed={"timeout": 900},
    )
    recipe["eval"] = {"per_epoch": 2}  # replacing base_recipe's steps schedules
    recipe["checkpoint"] = {"per_epoch": 2, "keep": 1, "load_best": True}
    path = write_recipe(tmp_path, recipe)

    data = ftune("data", str(path), "--format", "json", cwd=tmp_path)
    assert data.code == 0, data.text
    report = json.loads(data.out)["report"]
    assert report["rows"] == 60 and report["train_samples"] == 54  # train[:30%] of 200, 10% held out
    assert (report["sources"][0]["turns"], report["sources"][0]["unstopped"]) == (60, 0)

    planned = ftune("plan", str(path), "--format", "json", cwd=tmp_path)
    assert planned.code == 0, planned.text
    assert "tokens: 2 added" in planned.out

    res = ftune("run", str(path), cwd=tmp_path)
    assert res.code == 0, res.text
    assert "tiled loss: the output head and loss in slices: auto" in res.text
    run_dir = tmp_path / "runs" / "e2e"
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["trainer"]["ddp_timeout"] == 900 and plan["trainer"]["eval_steps"] == pytest.approx(0.25)
    # 54 samples / 9 = 6 steps an epoch, 12 in all: evaluations (and saves) every 3 steps
    evals = [(m["step"], m["eval_loss"]) for m in metrics(run_dir) if "eval_loss" in m]
    assert [step for step, _ in evals][:4] == [3, 6, 9, 12]
    assert evals[3][1] < evals[0][1]

    final = run_dir / "final"
    config = json.loads((final / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["init_lora_weights"] is True  # PiSSA converted to a plain LoRA
    assert config["trainable_token_indices"]
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(final)  # the tokens and the template travel with the adapter
    assert tok.eos_token == "<|im_end|>" and len(tok) == 386 and "<|im_start|>" in tok.chat_template
    deltas = {k: v for k, v in load_file(str(final / "adapter_model.safetensors")).items() if "tokens_delta" in k}
    assert len(deltas) == 2 and all(v.abs().sum() > 0 for v in deltas.values())  # embedding and head rows trained
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    base.resize_token_embeddings(len(tok))
    model = PeftModel.from_pretrained(base, str(final)).eval()
    prompt = tok.apply_chat_template([{"role": "user", "content": "add 2 and 3"}], tokenize=True,
                                     add_generation_prompt=True, return_tensors="pt", return_dict=True)
    assert model(**prompt).logits.shape[-1] == 386
