"""Every shipped recipe validates, opens with its schema line and the exact command that runs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ftune.recipe import load_recipe
from ftune.recipe.load import recipe_bases

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
LLAMA = sorted(RECIPES.glob("llama7b-*.yaml"))
ALL = sorted(p for p in RECIPES.rglob("*.yaml") if "bases" not in p.parts)


def test_the_issue_recipes_ship():
    names = {p.name for p in LLAMA}
    assert names == {
        "llama7b-lora.yaml",
        "llama7b-qlora.yaml",
        "llama7b-full-fsdp.yaml",
        "llama7b-prefix.yaml",
        "llama7b-llama-adapter.yaml",
        "llama7b-freeze.yaml",
        "llama7b-dpo-lora.yaml",
    }


@pytest.mark.parametrize("path", ALL, ids=[str(p.relative_to(RECIPES)) for p in ALL])
def test_shipped_recipe_validates(path):
    loaded = load_recipe(path)
    # the run's name says where the recipe lives: recipes/demo/pretrain.yaml is demo-pretrain
    assert loaded.recipe.name == "-".join(path.relative_to(RECIPES).with_suffix("").parts)


@pytest.mark.parametrize("path", LLAMA, ids=[p.name for p in LLAMA])
def test_header_and_base(path):
    lines = path.read_text().splitlines()
    assert lines[0] == "# yaml-language-server: $schema=../schemas/recipe.schema.json"
    assert f"ftune run recipes/{path.name}" in "\n".join(lines[1:4])
    assert recipe_bases(path) == [str(RECIPES / "bases" / "llama2-7b.yaml")]
    r = load_recipe(path).recipe
    assert r.model.path == "meta-llama/Llama-2-7b-hf"
    data = "data/preferences.jsonl" if r.train.objective == "dpo" else "data/alpaca.jsonl"
    assert [s.path for s in r.data.train] == [data]
    assert r.model.trust_remote_code is False


def test_lora_is_the_issue_example():
    r = load_recipe(RECIPES / "llama7b-lora.yaml").recipe
    assert (r.peft.method, r.peft.r, r.peft.alpha, r.peft.dropout) == ("lora", 8, 16, 0.05)
    assert list(r.peft.target_modules) == ["q_proj", "v_proj"]
    assert (r.distributed.strategy, r.distributed.num_processes) == ("fsdp", 8)
    assert r.distributed.fsdp.activation_checkpointing is True
    assert (r.train.epochs, r.train.lr_scheduler, r.train.warmup_ratio) == (3, "cosine", 0.03)
    assert (r.eval.strategy, r.eval.steps, r.checkpoint.steps) == ("steps", 200, 500)
    assert r.output.dir == "runs/llama7b-lora"


def test_method_specific_recipes():
    load = lambda name: load_recipe(RECIPES / name).recipe  # noqa: E731
    q = load("llama7b-qlora.yaml")
    assert (q.quantization.bits, q.quantization.type, q.peft.method) == (4, "nf4", "lora")
    assert q.distributed.strategy in ("none", "ddp")
    assert load("llama7b-full-fsdp.yaml").peft.method == "full"
    assert load("llama7b-full-fsdp.yaml").distributed.strategy == "fsdp"
    assert load("llama7b-prefix.yaml").peft.method == "prefix"
    assert load("llama7b-llama-adapter.yaml").peft.method == "llama-adapter"
    freeze = load("llama7b-freeze.yaml").peft
    assert freeze.method == "freeze"
    from ftune.methods.freeze import trainable_names

    names = [f"model.layers.{i}.mlp.up_proj.weight" for i in range(32)] + ["lm_head.weight", "model.norm.weight"]
    assert trainable_names(names, freeze) == [
        "model.layers.30.mlp.up_proj.weight",
        "model.layers.31.mlp.up_proj.weight",
        "lm_head.weight",
    ]


def test_base_is_partial():
    base = (RECIPES / "bases" / "llama2-7b.yaml").read_text()
    assert "name:" not in base  # a base only: validated through the recipes that extend it


def test_dpo_recipe_compiles_to_trl_dpo():
    from ftune.plan.compile import compile_plan

    plan = compile_plan(load_recipe(RECIPES / "llama7b-dpo-lora.yaml"), check_inputs=False, gpus=1)
    assert plan.trainer_class == "trl.DPOTrainer" and plan.trainer["beta"] == 0.1
    assert plan.trainer["metric_for_best_model"] == "eval_rewards/accuracies" and plan.trainer["greater_is_better"]
