"""`train.precision: fp8`: which linear layers torchao's float8 training converts (ftune.fp8, on models built on the
meta device), and where the recipe is refused (a device without FP8 tensor cores: this CPU machine)."""

from __future__ import annotations

import pytest


def meta_model(config):
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def test_a_dense_model_converts_every_projection_but_the_head():
    from transformers import LlamaConfig

    from ftune.fp8 import fp8_layers, module_filter

    model = meta_model(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=384))
    layers = fp8_layers(model)
    assert layers.kept == {"lm_head": "output head"}
    assert len(layers.converted) == 2 * 7  # q, k, v, o, gate, up, down per layer
    assert all(n.startswith("model.layers.") for n in layers.converted)
    assert layers.converted_params == layers.linear_params - 384 * 64
    keep = module_filter(model)
    modules = dict(model.named_modules())
    assert keep(modules["model.layers.0.mlp.down_proj"], "model.layers.0.mlp.down_proj")
    assert not keep(modules["lm_head"], "lm_head")


def test_a_moe_model_keeps_its_routers_and_gates_and_odd_shapes():
    from transformers import Qwen2MoeConfig

    from ftune.fp8 import fp8_layers

    model = meta_model(Qwen2MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                      shared_expert_intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, vocab_size=384))
    import torch

    with torch.device("meta"):  # a router that is a plain nn.Linear (older or remote-code MoE models)
        model.model.layers[1].mlp.gate = torch.nn.Linear(64, 16, bias=False)
    layers = fp8_layers(model)
    kept = layers.kept
    assert kept["lm_head"] == "output head"
    # transformers 5's routers are TopKRouter modules (never converted: not nn.Linear); a Linear one is kept
    assert {n for n, why in kept.items() if why == "router"} == {
        "model.layers.0.mlp.shared_expert_gate", "model.layers.1.mlp.shared_expert_gate", "model.layers.1.mlp.gate"}
    # the shared expert's 40-wide projections can't go through a scaled matmul (not multiples of 16)
    assert {n for n, why in kept.items() if why == "shape"} == {
        f"model.layers.{i}.mlp.shared_expert.{p}" for i in range(2) for p in ("gate_proj", "up_proj", "down_proj")}
    assert "model.layers.0.self_attn.q_proj" in layers.converted
    assert not any(n.endswith((".gate", "_gate")) or n == "lm_head" for n in layers.converted)


def test_fp8_on_this_cpu_is_refused_at_train_precision_naming_the_device(tmp_path):
    from ftune.errors import RecipeError
    from ftune.plan.compile import compile_plan
    from ftune.recipe import load_recipe
    from tests.unit.test_rl import _write, line_of

    train = {"precision": "fp8", "mixed_precision": "bf16", "compile": True}
    with pytest.raises(RecipeError) as err:
        compile_plan(load_recipe(_write(tmp_path, train, data={"train": [{"path": "p.jsonl"}]})), check_inputs=False)
    [p] = [q for q in err.value.problems if q.path == "train.precision"]
    assert "compute capability >= 8.9" in p.message and "this run is on cpu" in p.message
    assert line_of(p) == "precision: fp8"


def test_fp8_without_bf16_or_compile_or_on_a_quantized_base_is_refused(tmp_path):
    from ftune.errors import RecipeError
    from ftune.recipe import load_recipe
    from tests.unit.test_rl import _write

    with pytest.raises(RecipeError) as err:
        load_recipe(_write(tmp_path, {"precision": "fp8"}, data={"train": [{"path": "p.jsonl"}]},
                           quantization={"bits": 4}))
    assert {q.path for q in err.value.problems} == {"train.precision"}  # every problem at once, at the key
    said = " ".join(q.message for q in err.value.problems if q.path == "train.precision")
    assert "mixed_precision" in said and "torch.compile" in said and "bitsandbytes" in said


def test_fp8_on_an_ada_or_newer_gpu_passes_and_an_ampere_one_is_refused(monkeypatch):
    import torch

    from ftune.plan.checks import environment
    from ftune.recipe.schema import Recipe

    recipe = Recipe.model_validate({"name": "f", "model": {"path": "m"}, "data": {"train": [{"path": "p.jsonl"}]},
                                    "train": {"precision": "fp8", "mixed_precision": "bf16", "compile": True}})
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (8, 0))
    [p] = environment.fp8(recipe, "cuda")
    assert "A100" in p.message and "capability 8.0" in p.message
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    monkeypatch.setattr(environment, "_importable", lambda name: True)
    assert environment.fp8(recipe, "cuda") == []
    monkeypatch.setattr(environment, "_importable", lambda name: False)
    [p] = environment.fp8(recipe, "cuda")
    assert "ftune[fp8]" in p.hint


@pytest.mark.parametrize("method, trains", [("full", 6), ("lora", 4)])
def test_plan_shows_fp8_cost_and_memory_beside_bf16_for_an_8b(method, trains):
    """Llama-3.1-8B (catalog config, meta device): the 32 x 7 projections convert, the head stays; the FLOPs share
    is the closed form (trains x converted weights over trains x all linear weights + causal attention)."""
    from ftune.estimate.estimate import estimate
    from ftune.recipe.schema import Recipe

    recipe = Recipe.model_validate({
        "name": "f", "model": {"path": "meta-llama/Llama-3.1-8B", "dtype": "bfloat16"},
        "data": {"train": [{"path": "t.jsonl"}], "max_seq_length": 4096},
        "peft": {"method": method, **({"target_modules": "all-linear"} if method == "lora" else {})},
        "train": {"precision": "fp8", "mixed_precision": "bf16", "compile": True, "gradient_checkpointing": True}})
    est = estimate(recipe, world_size=1, num_processes=1, gpu_memory=80 * 1024**3)
    f = est.fp8
    assert f.converted_layers == 32 * 7 and f.kept == {"output head": 1}
    head, hidden = 128256 * 4096, 4096
    share = trains * f.converted_params / (trains * (f.converted_params + head) + 6 * 32 * 4096 * hidden)
    assert f.matmul_share == pytest.approx(share, abs=1e-4)
    assert f.step_cost_vs_bf16 == pytest.approx(1 - share / 2, abs=1e-3)
    assert f.bf16_memory_bytes == est.total_bytes
    assert 0 < f.memory_bytes - f.bf16_memory_bytes <= 2 * 14336 * 4096  # the largest layer's transient copies
