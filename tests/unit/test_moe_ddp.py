"""DDP and MoE: an expert no token is routed to still gets a gradient with transformers 5's fused experts, so the
plan turns DDP's unused-parameter search off for them, and on for experts kept as separate modules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ftune.methods.lora import Config, inject
from ftune.plan.compile import compile_plan
from ftune.plan.ddp import experts_kind, find_unused
from ftune.recipe import load_recipe
from tests.unit.test_moe import tiny


def _route_to_first_two(model):
    """Every router sends every token to experts 0 and 1 (equal weights): experts 2 and 3 stay idle."""
    import torch

    def hook(module, args, output):
        logits, weights, indices = output
        return logits, torch.full_like(weights, 0.5), torch.tensor([0, 1]).expand_as(indices).contiguous()

    for name, module in model.named_modules():
        if name.endswith("mlp.gate") and not name.endswith(".base_layer"):
            module.register_forward_hook(hook)


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_an_idle_fused_expert_still_gets_a_gradient(arch):
    """The fact the plan's decision rests on: with experts 2 and 3 idle, every trainable tensor (the expert LoRA
    included) gets a gradient, zero in the idle experts' blocks, non-zero in the routed ones'."""
    import torch

    model = inject(tiny(arch), Config(experts=True, dropout=0.0, r=4), "causal-lm")
    _route_to_first_two(model)
    with torch.no_grad():  # lora_B starts at zero, which would make lora_A's gradient zero everywhere
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)
    data = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))
    model(input_ids=data, labels=data).loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert missing == []  # DDP would wait for any of these, or fail, with find_unused_parameters off
    a = dict(model.named_parameters())["base_model.model.model.layers.0.mlp.experts.lora_A.default.weight"]
    per_expert = a.grad.reshape(4, 4, -1).abs().amax(dim=(1, 2))  # rank 4 rows per expert
    assert bool((per_expert[:2] > 0).all()) and bool((per_expert[2:] == 0).all()), per_expert


def test_experts_kept_as_modules_are_told_apart():
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

    assert experts_kind(tiny("qwen3_moe")) == "fused"
    assert experts_kind(torch.nn.Sequential(Block())) == "modules"
    assert experts_kind(torch.nn.Sequential(torch.nn.Linear(4, 4))) is None


def _ddp_recipe(tmp_path: Path, model_dir: Path, strategy: str = "ddp") -> Path:
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "hello"}\n')
    recipe = {"name": "unit", "model": {"path": str(model_dir)}, "data": {"train": [{"path": str(data)}]},
              "peft": {"method": "lora", "experts": True, "dropout": 0.0} if "moe" in model_dir.name else {},
              "distributed": {"strategy": strategy, "num_processes": 2},
              "train": {"max_steps": 2}, "output": {"dir": str(tmp_path / "runs" / "unit")}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def test_the_plan_decides_the_unused_parameter_search(tmp_path, tiny_qwen3_moe_dir, tiny_model_dir):
    moe = compile_plan(load_recipe(_ddp_recipe(tmp_path, tiny_qwen3_moe_dir)))
    assert moe.trainer["ddp_find_unused_parameters"] is False
    assert any("find_unused_parameters off: the fused expert tensors take part in every step" in n for n in moe.notes)
    dense = compile_plan(load_recipe(_ddp_recipe(tmp_path, tiny_model_dir)))
    assert "ddp_find_unused_parameters" not in dense.trainer  # transformers' own default
    fsdp = compile_plan(load_recipe(_ddp_recipe(tmp_path, tiny_qwen3_moe_dir, strategy="fsdp")))
    assert "ddp_find_unused_parameters" not in fsdp.trainer  # FSDP has no such search
    assert json.loads(moe.model_dump_json())["trainer"]["ddp_find_unused_parameters"] is False  # in plan.json


def test_separate_expert_modules_turn_the_search_on():
    from types import SimpleNamespace

    recipe = SimpleNamespace(distributed=SimpleNamespace(strategy="ddp"))
    notes: list[str] = []
    assert find_unused(recipe, 2, "modules", notes) == {"ddp_find_unused_parameters": True}
    assert "experts are separate modules" in notes[0]
    assert find_unused(recipe, 1, "modules", []) == {}  # one process: no DDP
