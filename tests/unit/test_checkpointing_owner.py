"""Activation checkpointing has one owner, decided in the Plan: the Trainer (HF's per-layer checkpointing) or FSDP
(checkpoint wrappers after sharding), never both. QLoRA's k-bit preparation asks the Plan, not the recipe."""

from __future__ import annotations

import json

import pytest
import yaml

from ftune.plan.compile import compile_plan
from ftune.recipe import load_recipe
from ftune.tiny import CONFIG

QLORA = {"bits": 4, "compute_dtype": "float32", "quant_storage": "float32"}


def _plan(tmp_path, train: dict, distributed: dict, quantization: dict | None = QLORA):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(CONFIG))
    (tmp_path / "d.jsonl").write_text('{"text": "hello"}\n')
    recipe = {"name": "gc", "model": {"path": str(model), "dtype": "float32"},
              "data": {"train": [{"path": str(tmp_path / "d.jsonl")}]},
              "peft": {"method": "lora", "r": 4, "target_modules": ["q_proj", "v_proj"]},
              "distributed": distributed, "train": {"max_steps": 1, **train},
              "output": {"dir": str(tmp_path / "runs" / "gc")}}
    if quantization:
        recipe["quantization"] = quantization
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    return compile_plan(load_recipe(str(tmp_path / "r.yaml")), check_inputs=False)


FSDP_AC = {"strategy": "fsdp", "num_processes": 2, "fsdp": {"activation_checkpointing": True}}


@pytest.mark.parametrize(("train", "distributed", "owner"), [
    ({"gradient_checkpointing": True}, FSDP_AC, "fsdp"),  # both flags: FSDP's replaces the Trainer's
    ({"gradient_checkpointing": False}, FSDP_AC, "fsdp"),
    ({"gradient_checkpointing": True}, {"strategy": "fsdp", "num_processes": 2}, "trainer"),
    ({"gradient_checkpointing": True}, {"strategy": "none"}, "trainer"),
    ({"gradient_checkpointing": False}, {"strategy": "none"}, None),
])
def test_the_plan_names_one_owner(tmp_path, train, distributed, owner):
    plan = _plan(tmp_path, train, distributed)
    assert plan.activation_checkpointing == owner
    assert plan.trainer["activation_checkpointing"] is (owner == "trainer")
    assert bool((plan.trainer.get("fsdp_config") or {}).get("activation_checkpointing")) is (owner == "fsdp")
    assert json.loads(plan.model_dump_json())["activation_checkpointing"] == owner  # plan.json says which


def test_the_plan_decides_the_upcast(tmp_path):
    assert _plan(tmp_path, {}, {"strategy": "none"}).upcast_non_quantized is True  # peft's default
    assert _plan(tmp_path, {}, FSDP_AC).upcast_non_quantized is False  # one dtype per FSDP shard
    assert _plan(tmp_path, {}, {"strategy": "none"}, None).upcast_non_quantized is False  # nothing quantized


@pytest.mark.parametrize("checkpointing", [False, True])
def test_kbit_preparation_checkpoints_only_when_the_plan_gives_it_to_the_trainer(tiny_model_dir, checkpointing):
    import torch
    from transformers import AutoModelForCausalLM

    from ftune.plan.quantization import bnb_config
    from ftune.recipe.schema import QuantizationSection
    from ftune.worker import quantize

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32,
                                                 quantization_config=bnb_config(QuantizationSection(**QLORA)))
    model = quantize.prepare(model, upcast=False, checkpointing=checkpointing)
    flags = [m.gradient_checkpointing for m in model.modules() if hasattr(m, "gradient_checkpointing")]
    assert flags and all(f is checkpointing for f in flags)
    assert model.config.use_cache is (not checkpointing)
