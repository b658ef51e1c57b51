"""Continuing a run's adapter (model.path at the first run's final/): the peft stage starts from its trained weights,
trainable; through `ftune run`, DPO's reference is that starting policy (rewards 0 at step 0, which a bare-base
reference would not give), and final/ is one adapter naming the real base, loadable as `ftune eval` loads it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.e2e._util import base_recipe, ftune, metrics, write_recipe

pytestmark = pytest.mark.slow
QUIET = {"dir": "runs/first", "report_to": ["none"], "loss_curve": False}


@pytest.fixture(scope="module")
def first(tmp_path_factory, tiny_model_dir, text_data_file) -> Path:
    """A tiny SFT LoRA run (r=4, eval at its end); its final/ is what the other runs continue."""
    folder = tmp_path_factory.mktemp("first")
    recipe = base_recipe(tiny_model_dir, text_data_file, name="first",
                         peft={"method": "lora", "r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj"]},
                         train={"max_steps": 4, "logging_steps": 2, "learning_rate": 3e-2}, eval={"strategy": "no"},
                         checkpoint={"strategy": "no"}, output=QUIET)
    res = ftune("run", str(write_recipe(folder, recipe)), cwd=folder)
    assert res.code == 0, res.text
    return folder / "runs" / "first"


def _adapter_weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


def test_the_peft_stage_loads_the_adapter_trainable(first, tmp_path, tiny_model_dir, text_data_file):
    """SFT from final/: the worker's stages in this process (an SFT run's trainer touches no adapter): the starting
    weights are the first run's trained ones, trainable, in one adapter (a fresh init would have lora_B = 0)."""
    from ftune.plan.compile import compile_plan
    from ftune.recipe import load_recipe
    from ftune.runtime.model import load_model
    from ftune.worker.peft import apply_method
    from ftune.datastage.tokenizer import load_tokenizer

    recipe = base_recipe(first / "final", text_data_file, name="second", peft={"method": "lora", "dropout": 0.1},
                         output={"dir": str(tmp_path / "runs" / "second")})
    plan = compile_plan(load_recipe(str(write_recipe(tmp_path, recipe))))
    assert plan.model_load.adapter == str((first / "final").resolve())
    assert plan.model_load.path == str(tiny_model_dir) and plan.recipe.peft.r == 4
    tok = load_tokenizer(plan)
    model, counts = apply_method(load_model(plan, tok), plan)
    assert list(model.peft_config) == ["default"] and model.peft_config["default"].lora_dropout == 0.1
    assert counts.trainable == json.loads((first / "params.json").read_text())["trainable"]
    saved = _adapter_weights(first / "final")
    live = {n.replace(".default", ""): p for n, p in model.named_parameters() if "lora_" in n}
    assert saved.keys() == live.keys() and all(live[k].requires_grad for k in live)
    assert all(bool((live[k].detach() == saved[k]).all()) for k in saved)
    assert any(float(saved[k].abs().sum()) > 0 for k in saved if "lora_B" in k)  # trained: not the zero init


@pytest.mark.skipif(__import__("importlib").util.find_spec("trl") is None, reason="needs trl")
def test_dpo_reference_is_the_continued_policy(first, tmp_path, tiny_model_dir):
    from tests.e2e.test_preference import preference_rows

    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in preference_rows(40, seed=5)))
    recipe = base_recipe(first / "final", data, name="dpo", peft={"method": "lora"},
                         data={"train": [{"path": str(data), "format": "preference"}], "eval": {"split": 0.2}},
                         train={"objective": "dpo", "max_steps": 2, "logging_steps": 1},
                         eval={"strategy": "no", "on_start": True}, checkpoint={"strategy": "no"},
                         output={**QUIET, "dir": "runs/dpo"})
    res = ftune("run", str(write_recipe(tmp_path, recipe)), cwd=tmp_path)
    assert res.code == 0, res.text
    run = tmp_path / "runs" / "dpo"
    start = next(m for m in metrics(run) if "eval_rewards/margins" in m)
    assert start["step"] == 0
    # policy == reference at step 0: every reward is 0 (with the bare base as reference they would not be)
    assert start["eval_rewards/chosen"] == start["eval_rewards/rejected"] == start["eval_rewards/margins"] == 0.0
    assert math.isclose(start["eval_loss"], math.log(2), rel_tol=1e-5)

    final = run / "final"
    assert not (final / "ref").exists() and sorted(p.name for p in final.glob("*.safetensors")) == [
        "adapter_model.safetensors"]
    assert _adapter_weights(final).keys() == _adapter_weights(first / "final").keys()
    assert json.loads((final / "adapter_config.json").read_text())["base_model_name_or_path"] == str(tiny_model_dir)
    assert json.loads((final / "ftune.json").read_text())["base_model"] == str(tiny_model_dir)
    before, after = _adapter_weights(first / "final"), _adapter_weights(final)
    assert before.keys() == after.keys() and any(not (before[k] == after[k]).all() for k in before)  # trained on

    from ftune.infer import load, source  # what `ftune eval/merge/generate` load: the adapter over the real base

    target = source.resolve(str(run))
    model = load.load_trained(target.plan, final, load.load_tokenizer(target))
    assert list(model.peft_config) == ["default"]
    live = {n.replace(".default", ""): p for n, p in model.named_parameters() if "lora_" in n}
    assert all(bool((live[k] == after[k]).all()) for k in after)
