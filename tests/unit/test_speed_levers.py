"""Speed and memory levers: validated (located refusals where they can't work), compiled into plan.trainer,
and accounted for by `ftune plan`'s memory model."""

from __future__ import annotations

import pytest
import yaml

from ftune.errors import RecipeError
from ftune.plan.compile import compile_plan
from ftune.recipe import load_recipe

BASE = {"name": "t", "model": {"path": "m"}, "data": {"train": [{"path": "d.jsonl"}]}}


def _load(tmp_path, **top):
    raw = {**BASE, "train": {"max_steps": 5}, **top}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_recipe(path)


def _problems(tmp_path, compile_too: bool = False, **top) -> dict:
    with pytest.raises(RecipeError) as err:
        loaded = _load(tmp_path, **top)
        if compile_too:
            compile_plan(loaded, check_inputs=False)
    return {p.path: p for p in err.value.problems}


def test_levers_reach_the_trainer_kwargs(tmp_path):
    plan = compile_plan(_load(tmp_path, train={"max_steps": 5, "compile": True, "compile_backend": "aot_eager",
                                               "group_by_length": True,
                                               "dataloader": {"workers": 2, "prefetch_factor": 4}}),
                        check_inputs=False)
    t = plan.trainer
    assert (t["torch_compile"], t["torch_compile_backend"]) == (True, "aot_eager")
    assert t["train_sampling_strategy"] == "group_by_length"
    assert (t["dataloader_num_workers"], t["dataloader_prefetch_factor"]) == (2, 4)
    assert t["dataloader_pin_memory"] is False  # CPU: nothing to pin for
    assert t["use_liger_kernel"] is False and t["include_num_input_tokens_seen"] == "no"
    assert t["optim"] == "adamw_torch_fused"  # transformers' own default with torch >= 2.8


def test_recipe_rules_for_levers(tmp_path):
    found = _problems(tmp_path, data={"train": [{"path": "d.jsonl"}], "packing": True, "max_seq_length": 64},
                      train={"max_steps": 5, "compile_backend": "inductor", "group_by_length": True,
                             "dataloader": {"prefetch_factor": 2}})
    assert "train.compile is false" in found["train.compile_backend"].message
    assert "packed rows" in found["train.group_by_length"].message
    assert "needs dataloader workers" in found["train.dataloader.prefetch_factor"].message
    cls = _problems(tmp_path, model={"path": "m", "task": "sequence-classification", "labels": ["a", "b"]},
                    data={"train": [{"path": "d.csv", "format": "classification"}]},
                    train={"max_steps": 5, "kernels": "liger"})
    assert "causal-LM loss" in cls["train.kernels"].message


def test_liger_and_flash_attention_are_refused_on_cpu_located(tmp_path):
    found = _problems(tmp_path, compile_too=True, model={"path": "m", "attn_implementation": "flash_attention_2"},
                      train={"max_steps": 5, "kernels": "liger"})
    assert "Triton GPU kernels; this run is on CPU" in found["train.kernels"].message
    assert "`train.tiled_loss: true`" in found["train.kernels"].hint  # the same memory saving, on any device
    assert found["train.kernels"].location.line == 10  # name, model(2), data(3), train: max_steps, kernels
    assert "CUDA GPUs only" in found["model.attn_implementation"].message


def test_flex_attention_training_is_refused_on_cpu_before_launch_located(tmp_path):
    """torch has no FlexAttention backward on CPU: the run used to launch and fail after (exit 3)."""
    found = _problems(tmp_path, compile_too=True, model={"path": "m", "attn_implementation": "flex_attention"},
                      data={"train": [{"path": "d.jsonl"}], "packing": True, "max_seq_length": 64})
    p = found["model.attn_implementation"]
    assert p.message.startswith("flex_attention can't train on cpu: torch has no FlexAttention backward on CPU")
    assert "model.attn_implementation: sdpa" in p.hint and p.location.line == 4  # name, model:, path, attn


def test_flex_attention_is_allowed_on_cuda_and_swapped_for_forward_uses_on_cpu():
    from ftune.plan.checks import environment
    from ftune.recipe.schema import Recipe

    r = Recipe.model_validate({**BASE, "model": {"path": "m", "attn_implementation": "flex_attention"}})
    assert "model.attn_implementation" not in {p.path for p in environment.kernels(r, "cuda")}
    assert environment.forward_attention("flex_attention", "cuda") == ("flex_attention", None)
    attn, note = environment.forward_attention("flex_attention", "cpu")
    assert attn == "sdpa" and "wrong outputs, or NaN, for grouped-query models" in note
    assert environment.forward_attention("eager", "cpu") == ("eager", None)
    assert environment.forward_attention(None, "cpu") == (None, None)


def test_liger_without_the_package_on_a_gpu_machine_gives_the_install_hint(monkeypatch):
    from ftune.plan.checks import environment
    from ftune.recipe.schema import Recipe

    real = environment.importlib.util.find_spec
    monkeypatch.setattr(environment.importlib.util, "find_spec",
                        lambda name: None if name in ("liger_kernel", "flash_attn") else real(name))
    r = Recipe.model_validate({**BASE, "model": {"path": "m", "attn_implementation": "flash_attention_2"},
                               "train": {"max_steps": 1, "kernels": "liger"}})
    found = {p.path: p for p in environment.kernels(r, "cuda")}
    assert "pip install 'ftune[kernels]'" in found["train.kernels"].hint
    assert "pip install flash-attn" in found["model.attn_implementation"].hint


def test_upcast_choice_and_its_refusal_under_fsdp(tmp_path):
    from ftune.plan.quantization import upcasts

    q = {"bits": 4, "compute_dtype": "bfloat16"}
    assert upcasts(_load(tmp_path, quantization=q).recipe)  # peft's default
    assert not upcasts(_load(tmp_path, quantization={**q, "upcast_non_quantized": False}).recipe)
    found = _problems(tmp_path, model={"path": "m", "dtype": "bfloat16"}, quantization={
        **q, "quant_storage": "bfloat16", "upcast_non_quantized": True}, distributed={"strategy": "fsdp"})
    assert "can't be upcast" in found["quantization.upcast_non_quantized"].message


def test_memory_model_accounts_for_the_levers():
    from dataclasses import replace

    from ftune.estimate.facts import ActivationProfile, ParamFact
    from ftune.estimate.memory import Layout, per_device

    facts = [ParamFact("w", (1024, 1024), "bfloat16", 2, True)]
    profile = ActivationProfile((4_000_000,) * 4, (500_000,) * 4, 9_000_000, 8_000_000)
    base = per_device(facts, profile, Layout())
    fused = per_device(facts, profile, Layout(fused_loss=True))
    # the fp32 log-probs saved by the head and the two logits-sized gradients are gone
    assert base.total - fused.total == 8_000_000 + 2 * 8_000_000
    offloaded = per_device(facts, profile, replace(Layout(), offload_activations=True))
    assert offloaded.offloaded == profile.saved(False)
    assert base.total - offloaded.total == profile.saved(False) - max(profile.layer_bytes)


@pytest.mark.parametrize("fused_loss", [False, True])
def test_checkpointing_never_adds_to_activation_offloading(fused_loss):
    """The issue's case: with offloading and Liger (fused loss), turning checkpointing on doubled a long-context
    plan (94.6 -> 188.3 GiB): the recomputed layer is the layer in flight, already counted once."""
    from ftune.estimate.facts import ActivationProfile, ParamFact
    from ftune.estimate.memory import Layout, per_device

    facts = [ParamFact("w", (1024, 1024), "bfloat16", 2, True)]
    profile = ActivationProfile((40_000_000,) * 4, (5_000_000,) * 4, 9_000_000, 8_000_000)
    alone = per_device(facts, profile, Layout(offload_activations=True, fused_loss=fused_loss))
    both = per_device(facts, profile, Layout(offload_activations=True, checkpointing=True, fused_loss=fused_loss))
    assert both.total == alone.total  # one layer on the device either way
    assert both.offloaded < alone.offloaded  # the host keeps layer inputs only
    ckpt = per_device(facts, profile, Layout(checkpointing=True, fused_loss=fused_loss))
    assert both.total <= ckpt.total
