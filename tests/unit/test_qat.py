"""`quantization.qat` (torchao): the recipe rules, the one decision of what this machine can run (every branch
forced), the group-size check on the meta model, and the runtime in process on a tiny Llama: fake quantization
off until `start_after_steps`, final/'s names unchanged, and the converted, saved, reloaded model computing what
the fake-quantized one did (the cheap sibling of tests/e2e/test_qat.py)."""

from __future__ import annotations

import pytest

from ftune.plan import qat as plan_qat
from ftune.recipe.rules import check
from ftune.recipe.schema import Recipe
from ftune.tiny import CONFIG


def recipe(qat: dict | None = None, **sections) -> Recipe:
    data = {"name": "q", "model": {"path": "models/tiny"}, "data": {"train": [{"path": "train.jsonl"}]},
            "peft": {"method": "full"}, "train": {"max_steps": 10},
            "quantization": {"qat": {"scheme": "int4-weight", **(qat or {})}}}
    data.update(sections)
    return Recipe.model_validate(data)


def problems(r: Recipe) -> dict[str, str]:
    return {p.path: p.message for p in check(r)}


def test_a_qat_recipe_is_valid_and_not_a_bitsandbytes_base():
    r = recipe({"group_size": 64, "start_after_steps": 3})
    assert problems(r) == {}
    assert r.kbit is None and r.qat.group_size == 64 and r.qat.start_after_steps == 3


@pytest.mark.parametrize("section, path, words", [
    ({}, "quantization", "needs `bits`"),
    ({"bits": 4, "qat": {"scheme": "int4-weight"}}, "quantization.qat", "one or the other"),
    ({"qat": {"scheme": "int4-weight"}, "double_quant": True}, "quantization.double_quant", "bitsandbytes"),
])
def test_the_section_holds_bits_or_qat(section, path, words):
    r = recipe(quantization=section)
    assert words in problems(r)[path]


def test_qat_under_lora_is_refused_at_the_key():
    found = problems(recipe(peft={"method": "lora"}))
    assert "Q(W + BA)" in found["quantization.qat"]


@pytest.mark.parametrize("qat, path, words", [
    ({"group_size": 48}, "quantization.qat.group_size", "power of two"),
    ({"scheme": "fp8", "group_size": 32}, "quantization.qat.group_size", "ignored"),
    ({"start_after_steps": 10}, "quantization.qat.start_after_steps", "no step would train quantized"),
])
def test_qat_settings_that_cannot_work(qat, path, words):
    assert words in problems(recipe(qat))[path]


def test_qat_with_fsdp_is_refused():
    found = problems(recipe(distributed={"strategy": "fsdp", "num_processes": 2}))
    assert "not supported" in found["distributed.strategy"]


@pytest.mark.parametrize("scheme, device, capability, refused", [
    ("int4-weight", "cpu", None, None),
    ("int8-dynamic-act-int4-weight", "cpu", None, None),
    ("int4-weight", "cuda", (8, 0), None),
    ("fp8", "cpu", None, "this machine has none"),
    ("fp8", "cuda", (8, 0), "this GPU has 8.0"),
    ("fp8", "cuda", (8, 9), None),
    ("fp8", "cuda", (9, 0), None),
])
def test_what_this_machine_can_run_is_decided_in_one_place(scheme, device, capability, refused):
    why = plan_qat.runnable(scheme, device, capability)
    assert (why is None) if refused is None else (refused in why)
    found = plan_qat.environment_problems(recipe({"scheme": scheme}), device, capability)
    assert [p.path for p in found] == ([] if refused is None else ["quantization.qat.scheme"])


def test_a_missing_or_old_torchao_is_refused(monkeypatch):
    import importlib.metadata
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    (p,) = plan_qat.environment_problems(recipe(), "cpu", None)
    assert p.path == "quantization.qat" and "not installed" in p.message and "ftune[qat]" in p.hint
    monkeypatch.setattr(importlib.util, "find_spec", real)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.12.0")
    (p,) = plan_qat.environment_problems(recipe(), "cpu", None)
    assert "found 0.12.0" in p.message


def test_group_size_must_divide_every_quantized_layer():
    from transformers import LlamaConfig

    from ftune.models.meta import build_meta_model

    r = recipe({"group_size": 256})
    model = build_meta_model(r, LlamaConfig(**{k: v for k, v in CONFIG.items() if k not in ("model_type",
                                                                                            "architectures")}))
    (p,) = plan_qat.model_problems(r, model)
    assert p.path == "quantization.qat.group_size" and "q_proj (64 inputs)" in p.message
    assert "down_proj (128 inputs)" in p.message and p.hint == "use `group_size: 64`"
    assert plan_qat.model_problems(recipe({"group_size": 64}), model) == []
    assert "lm_head" not in plan_qat.quantized_linears(model)


@pytest.fixture(scope="module")
def tiny():
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(**{k: v for k, v in CONFIG.items() if k not in ("model_type", "architectures")},
                         tie_word_embeddings=False)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("scheme", ["int4-weight", "int8-dynamic-act-int4-weight"])
def test_fake_quantized_training_converts_to_the_same_model(tmp_path, tiny, scheme):
    pytest.importorskip("torchao")
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    from ftune.recipe.schema import QatSection
    from ftune.runtime import qat

    section = QatSection(scheme=scheme, group_size=32, start_after_steps=2)
    x = torch.randint(0, tiny.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = tiny(x).logits
        model = qat.prepare(copy.deepcopy(tiny), section)
        assert len(qat.fake_quantized(model)) == 14  # 7 linears per layer, 2 layers; lm_head stays plain
        assert torch.equal(model(x).logits, plain)  # off until start_after_steps
        callback = qat.start_callback(section)
        for step in range(3):
            callback.on_step_begin(None, type("S", (), {"global_step": step})(), None, model=model)
            assert qat.fake_quantized(model)[0].weight_fake_quantizer.enabled == (step >= 2)
        fake = model(x).logits
        assert not torch.allclose(fake, plain, atol=1e-4)  # the int4 grid moved the outputs
        assert set(model.state_dict()) == set(tiny.state_dict())  # checkpoints hold the base names
    config = qat.quantization_config(tiny, section)
    qat.unwrap(model).save_pretrained(tmp_path / "plain")
    assert qat.fake_quantized(model) == []
    converted = AutoModelForCausalLM.from_pretrained(tmp_path / "plain", quantization_config=config).eval()
    converted.save_pretrained(tmp_path / "int4")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "int4").eval()
    assert type(reloaded.model.layers[0].mlp.down_proj.weight).__name__ == "IntxUnpackedToInt8Tensor"
    assert type(reloaded.lm_head.weight).__name__ == "Parameter"
    with torch.no_grad():
        # the same int4 grid and scales: equal up to float32 summation order (tolerance: a few ulps of logits ~1)
        assert torch.allclose(reloaded(x).logits, fake, atol=1e-5, rtol=0)
