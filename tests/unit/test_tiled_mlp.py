"""The tiled MLP (`train.tiled_mlp`): the same gradients as the untiled MLP (full and LoRA, with and without
checkpointing, dropout drawn alike in forward and its recompute), what the plan's probe says it keeps (equal to a
real CPU forward's saved tensors), the plan's slices and refusals, and the longest row with each lever."""

from __future__ import annotations

import re

import pytest
import yaml

from ftune.errors import RecipeError
from ftune.plan import tiling
from ftune.recipe import load_recipe
from ftune.recipe.schema import Recipe

BATCH, SEQ = 2, 48


def tiny(method: str, dropout: float = 0.0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=100)
    model = LlamaForCausalLM(config)
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules="all-linear"))
        for name, p in model.named_parameters():
            if "lora_B" in name:  # nonzero, so every adapter's gradient is nonzero
                torch.nn.init.normal_(p, std=0.1)
    model.train()
    return model


def step(model, checkpointing: bool, seed: int = 5):
    import torch

    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(0, 100, (BATCH, 17), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(seed)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def chunked(model, slices: int) -> None:
    """The reference for dropout: each MLP over `slices` slices with ordinary autograd (no recompute), which draws
    the random masks in the tiled MLP's order."""
    import torch

    for mlp in tiling.mlps(model):
        run = mlp.forward
        mlp.forward = lambda x, _run=run: torch.cat([_run(p) for p in torch.chunk(x, slices, dim=-2)], dim=-2)


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize(("method", "dropout"), [("full", 0.0), ("lora", 0.0), ("lora", 0.2)])
def test_tiled_mlp_gives_the_untiled_gradients(method, dropout, checkpointing):
    from ftune import tiled_mlp

    reference = tiny(method, dropout)
    if dropout:
        chunked(reference, 3)
    loss, grads = step(reference, checkpointing)
    model = tiny(method, dropout)
    assert tiled_mlp.apply(tiling.mlps(model), 3) == 2
    assert tiled_mlp.apply(tiling.mlps(model), 3) == 0  # once
    tiled_loss, tiled_grads = step(model, checkpointing)
    assert tiled_loss == pytest.approx(loss, rel=1e-6)
    assert grads.keys() == tiled_grads.keys() and len(grads) == (21 if method == "full" else 28)
    for name, g in grads.items():
        assert (tiled_grads[name] - g).abs().max().item() < 1e-6, name
        assert tiled_grads[name].abs().sum() > 0, name


def test_untiled_dropout_is_a_different_draw_so_the_reference_matters():
    """Negative control for the dropout case: the plain MLP draws one mask over all tokens, the slices one each."""
    loss, _ = step(tiny("lora", 0.2), False)
    model = tiny("lora", 0.2)
    chunked(model, 3)
    assert step(model, False)[0] != pytest.approx(loss, rel=1e-6)


def test_no_grad_calls_run_the_untiled_mlp():
    import torch

    from ftune import tiled_mlp

    model = tiny("full")
    calls = []
    for mlp in tiling.mlps(model):
        run = mlp.forward
        mlp.forward = lambda x, _run=run: calls.append(x.shape[-2]) or _run(x)
    tiled_mlp.apply(tiling.mlps(model), 4)
    ids = torch.randint(0, 100, (1, 12))
    with torch.no_grad():
        model(input_ids=ids)
    assert calls == [12, 12]  # whole, not in slices
    calls.clear()
    model(input_ids=ids).logits.sum().backward()
    assert calls == [3] * 8 + [3] * 8  # forward: 4 slices in each of 2 layers; backward: recomputed the same


@pytest.mark.parametrize(("rule", "tokens", "hidden", "want"), [
    ("auto", 4096, 4096, 1), ("auto", 4097, 4096, 2), ("auto", 131072, 4096, 32), ("auto", 10, 64, 1),
    (8, 4096, 4096, 8), (8, 5, 4096, 5)])
def test_slices(rule, tokens, hidden, want):
    assert tiling.slices(rule, tokens, hidden) == want


@pytest.mark.parametrize("method", ["lora", "full"])
def test_probe_of_the_tiled_mlp_equals_what_a_tiled_cpu_forward_saves(tiny_model_dir, method):
    from transformers import AutoModelForCausalLM

    from ftune import tiled_mlp
    from ftune.estimate.estimate import _apply_method
    from ftune.estimate.probe import probe_activations
    from ftune.methods import method_module
    from ftune.models.meta import _build, resolve_config
    from tests.unit.test_estimate_bytes import forward_saved_bytes

    peft = {"method": "lora", "r": 4, "target_modules": "all-linear"} if method == "lora" else {"method": "full"}
    r = Recipe.model_validate({"name": "t", "model": {"path": str(tiny_model_dir), "dtype": "float32"},
                               "data": {"train": [{"path": "d.jsonl"}], "max_seq_length": SEQ}, "peft": peft,
                               "train": {"per_device_batch_size": BATCH, "tiled_mlp": True}})
    meta, _, _ = _build(r, resolve_config(r)[0])
    meta = _apply_method(meta, r).to("meta")
    profile = probe_activations(meta, batch=BATCH, seq=SEQ, attn_implementation="sdpa",
                                layer_classes={"LlamaDecoderLayer"}, quantized=set())
    assert all(m > 0 for m in profile.mlp_bytes) and len(profile.mlp_bytes) == 2

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa")
    model = method_module(method).inject(model, r.peft, "causal-lm")
    tiled_mlp.apply(tiling.mlps(model), 3)
    assert profile.tiled(3).saved(False) == forward_saved_bytes(model, BATCH, SEQ)
    assert profile.tiled(3).saved(False) < profile.saved(False) - sum(profile.mlp_bytes) // 2  # what tiling saves
    assert profile.tiled(3).tile_bytes == -(-max(profile.mlp_bytes) // 3)


def plan_for(tmp_path, model_dir, **train) -> dict:
    raw = {"name": "t", "model": {"path": str(model_dir)}, "data": {"train": [{"path": "d.jsonl"}],
                                                                      "max_seq_length": 64},
           "peft": {"method": "lora", "r": 4, "target_modules": "all-linear"}, "train": {"max_steps": 2, **train}}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_recipe(path)


def problems(loaded) -> dict:
    from ftune.plan.compile import compile_plan

    with pytest.raises(RecipeError) as err:
        compile_plan(loaded, check_inputs=False)
    return {p.path: p for p in err.value.problems}


def test_rules_refuse_shards_without_tiling_and_deepspeed(tmp_path, tiny_model_dir):
    with pytest.raises(RecipeError) as err:
        plan_for(tmp_path, tiny_model_dir, tiled_mlp_shards=4)
    [p] = err.value.problems
    assert p.path == "train.tiled_mlp_shards" and "train.tiled_mlp is false" in p.message
    (tmp_path / "d.yaml").write_text(yaml.safe_dump({
        "name": "t", "model": {"path": str(tiny_model_dir)}, "data": {"train": [{"path": "d.jsonl"}]},
        "distributed": {"strategy": "deepspeed", "num_processes": 2}, "train": {"tiled_mlp": True}}))
    with pytest.raises(RecipeError) as err:
        load_recipe(tmp_path / "d.yaml")
    [p] = [p for p in err.value.problems if p.path == "train.tiled_mlp"]
    assert "DeepSpeed" in p.message and "fsdp" in p.hint


def test_plan_records_the_slices_and_refuses_a_moe_model(tmp_path, tiny_model_dir, tiny_qwen3_moe_dir):
    from ftune.plan.compile import compile_plan

    plan = compile_plan(plan_for(tmp_path, tiny_model_dir, tiled_mlp=True), check_inputs=False)
    assert plan.tiled_mlp_shards == "auto"
    assert any(n.startswith("train.tiled_mlp: each decoder layer's MLP in 1 slice of <= 64 tokens") for n in plan.notes)
    plan = compile_plan(plan_for(tmp_path, tiny_model_dir, tiled_mlp=True, tiled_mlp_shards=4), check_inputs=False)
    assert plan.tiled_mlp_shards == 4 and any("in 4 slices of <= 16 tokens" in n for n in plan.notes)
    assert compile_plan(plan_for(tmp_path, tiny_model_dir), check_inputs=False).tiled_mlp_shards is None
    found = problems(plan_for(tmp_path, tiny_qwen3_moe_dir, tiled_mlp=True))
    assert "mixture-of-experts" in found["train.tiled_mlp"].message


def test_a_model_without_decoder_mlps_is_refused():
    import torch

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ffn = torch.nn.Linear(4, 4)

    class Config:
        num_hidden_layers = 2

    class Model(torch.nn.Module):
        config = Config()

        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([Layer(), Layer()])

    recipe = Recipe.model_validate({"name": "t", "model": {"path": "m"}, "data": {"train": [{"path": "d.jsonl"}]},
                                    "train": {"tiled_mlp": True}})
    [p] = tiling.model_problems(recipe, Model())
    assert p.path == "train.tiled_mlp" and "no `mlp` module" in p.message
    assert tiling.model_problems(recipe.model_copy(update={"train": recipe.train.model_copy(
        update={"tiled_mlp": False})}), Model()) == []


def estimate_8b(**train):
    """The plan's estimate for Llama-3.1-8B (the catalog's config), LoRA r16 all-linear, bf16, packed rows of 4096,
    batch 1 with checkpointing, on a 141 GiB GPU, with `train` keys added."""
    from ftune.estimate.estimate import estimate

    r = Recipe.model_validate({
        "name": "t", "model": {"path": "meta-llama/Llama-3.1-8B", "dtype": "bfloat16"},
        "data": {"train": [{"path": "d.jsonl"}], "max_seq_length": 4096, "packing": True},
        "peft": {"method": "lora", "r": 16, "target_modules": "all-linear"},
        "train": {"per_device_batch_size": 1, "gradient_checkpointing": True, "mixed_precision": "bf16", **train}})
    return estimate(r, world_size=1, num_processes=1, gpu_memory=141 * 2**30)


def test_the_8b_plan_names_the_lever_that_raises_the_longest_row(tmp_path):
    """Llama-3.1-8B (the catalog's config) LoRA at 4096 on a 141 GiB GPU: each lever left off raises the longest
    row; the tiled MLP's slice stays hidden-size tokens long as rows grow, so it is not scaled with them."""
    est = estimate_8b
    plain, levers = est(), est(kernels="liger", activation_offloading=True, tiled_mlp=True)
    [line] = [n for n in plain.notes if n.startswith("longer rows")]
    steps = line.split("in turn): ", 1)[1].split("; ")
    assert [s.split(":")[0] for s in steps] == ["+ train.kernels", "+ train.activation_offloading",
                                               "+ train.tiled_mlp"]
    lengths = [int(re.search(r": ([\d,]+\d)(?:,|$)", s).group(1).replace(",", "")) for s in steps]
    assert plain.longest_seq < lengths[0] < lengths[1] < lengths[2]
    assert "of host memory" in steps[1] and "of host memory" not in steps[0]
    assert not [n for n in levers.notes if n.startswith("longer rows")]  # every lever on
    [cap] = [n for n in levers.notes if n.startswith("longest row:")]
    assert f"{lengths[2]:,} tokens fit in memory" in cap and lengths[2] > 5 * plain.longest_seq
    [item] = [i for i in levers.memory if "MLP slice" in i.detail]
    assert item.phase == "backward"


def test_planning_on_a_gpu_machine_says_when_offloaded_rows_outgrow_its_ram(monkeypatch):
    """Offloaded checkpoints of a long row live in host memory: planned on the GPU machine itself (its RAM known),
    the plan says when they need more than it has; with --gpu-memory (another machine) it can't know."""
    from ftune.estimate import estimate as est_module

    r = Recipe.model_validate({
        "name": "t", "model": {"path": "meta-llama/Llama-3.1-8B", "dtype": "bfloat16"},
        "data": {"train": [{"path": "d.jsonl"}], "max_seq_length": 131072, "packing": True},
        "peft": {"method": "lora", "r": 16, "target_modules": "all-linear"},
        "train": {"per_device_batch_size": 1, "gradient_checkpointing": True, "activation_offloading": True}})
    monkeypatch.setattr(est_module, "detect_device_memory", lambda: ("cuda", 141 * 2**30))
    for ram, said in ((16 * 2**30, True), (2**40, False)):
        monkeypatch.setattr(est_module, "host_memory", lambda ram=ram: ram)
        est = est_module.estimate(r, world_size=1, num_processes=1, gpu_memory=None)
        lines = [n for n in est.notes if n.startswith("offloaded to host memory")]
        assert bool(lines) == said, est.notes
        if said:  # 32 layers x 4,096 x bf16 = 256 KiB a token: 32 GiB at 131,072 tokens
            assert "more than the machine's 16.00 GiB of RAM" in lines[0] and est.offloaded_bytes > 32 * 2**30
    monkeypatch.setattr(est_module, "host_memory", lambda: 16 * 2**30)
    est = est_module.estimate(r, world_size=1, num_processes=1, gpu_memory=141 * 2**30)
    assert not [n for n in est.notes if n.startswith("offloaded to host memory")]


def test_longer_rows_host_memory_scales_the_activations_not_the_offloaded_states():
    """8B full fine-tuning on one GPU with FSDP's CPU offload: the parameters, gradients and optimizer states live
    in host memory whatever the row; only the offloaded checkpoints grow with it (the note once scaled them all,
    saying 4,080 GiB of host memory at 279K tokens with no activation offloaded)."""
    from ftune.estimate.estimate import estimate
    from ftune.estimate.long_rows import host_at

    r = Recipe.model_validate({
        "name": "t", "model": {"path": "meta-llama/Llama-3.1-8B", "dtype": "bfloat16"},
        "data": {"train": [{"path": "d.jsonl"}], "max_seq_length": 4096, "packing": True},
        "peft": {"method": "full"},
        "train": {"per_device_batch_size": 1, "gradient_checkpointing": True, "mixed_precision": "bf16"},
        "distributed": {"strategy": "fsdp", "num_processes": 1, "fsdp": {"cpu_offload": True}}})
    est = estimate(r, world_size=1, num_processes=1, gpu_memory=141 * 2**30)
    states = est.offloaded_bytes  # no activation offloaded: FSDP's states only (8B x bf16 weights, grads, moments)
    assert 8.0e9 * 8 < states < 8.1e9 * 8
    [line] = [n for n in est.notes if n.startswith("longer rows")]
    steps = line.split("in turn): ", 1)[1].split("; ")
    host = [float(re.search(r"([\d.]+) GiB of host memory", s).group(1)) for s in steps]
    rows = [int(re.search(r": ([\d,]+\d)(?:,|$)", s).group(1).replace(",", "")) for s in steps]
    assert host[0] == pytest.approx(states / 2**30, abs=0.01)  # Liger offloads nothing more
    per_token = 32 * 4096 * 2  # the offloaded checkpoints: one bf16 layer input per layer and token (+ the head's)
    assert 1.0 < (host[1] - states / 2**30) / (rows[1] * per_token / 2**30) < 1.2
    assert host[1] < host[2] < 400  # never the states x row / 4096 (thousands of GiB)

    from ftune.estimate.memory import DeviceMemory
    m = DeviceMemory((), "backward", 0, offloaded=100 + 40, offloaded_activations=40)
    assert host_at(m, 4096 * 3, 4096) == 100 + 120


def test_the_longest_row_is_capped_by_the_machines_ram_when_offloaded_rows_outgrow_it():
    """8B LoRA with every lever on a 141 GiB GPU holds ~664K tokens; their offloaded layer inputs (256 KiB a token)
    would not fit 128 GiB of RAM (the lent machine's, `--host-memory`): the plan's row is the one both hold, and a
    note says so. Without a known RAM (--gpu-memory alone: another machine), the device's row stands."""
    from ftune.estimate.estimate import estimate
    from ftune.estimate.long_rows import host_rows

    r = Recipe.model_validate({
        "name": "t", "model": {"path": "meta-llama/Llama-3.1-8B", "dtype": "bfloat16"},
        "data": {"train": [{"path": "d.jsonl"}], "max_seq_length": 4096, "packing": True},
        "peft": {"method": "lora", "r": 16, "target_modules": "all-linear"},
        "train": {"per_device_batch_size": 1, "gradient_checkpointing": True, "mixed_precision": "bf16",
                  "kernels": "liger", "activation_offloading": True, "tiled_mlp": True}})
    free = estimate(r, world_size=1, num_processes=1, gpu_memory=141 * 2**30)
    assert free.longest_seq == 131_072 and not [n for n in free.notes if "outgrow the machine" in n]
    small = estimate(r, world_size=1, num_processes=1, gpu_memory=141 * 2**30, host_ram=16 * 2**30)
    [note] = [n for n in small.notes if "outgrow the machine" in n]
    assert "16.00 GiB of RAM" in note and f"{small.longest_seq:,} tokens fit both" in note
    # 16 GiB over 256 KiB a token (+ the head's share): under 64K tokens, and what the host holds at that row fits
    assert 40_000 < small.longest_seq < 65_536
    per_token = small.offloaded_bytes / 4096
    assert small.longest_seq * per_token <= 16 * 2**30 < (small.longest_seq + 64) * per_token

    from ftune.estimate.memory import DeviceMemory
    m = DeviceMemory((), "backward", 0, offloaded=100 + 40, offloaded_activations=40)
    assert host_rows(m, 4096, 100 + 40 * 3, 1) == 4096 * 3  # the states first, then rows
    assert host_rows(m, 4096, 2 * (100 + 40 * 3), 2) == 4096 * 3  # each process's share
    assert host_rows(DeviceMemory((), "backward", 0, 100), 4096, 10**12, 1) is None  # nothing grows: no cap


def test_plan_takes_the_target_machines_ram(tiny_model_dir, tmp_path, capsys):
    """`ftune plan --gpu-memory --host-memory`: another machine's RAM caps the offloaded rows, said in a note."""
    import json

    import yaml

    from ftune.cli.main import main

    path = tmp_path / "r.yaml"
    (tmp_path / "d.jsonl").write_text('{"text": "hello there"}\n')
    path.write_text(yaml.safe_dump({"name": "t", "model": {"path": str(tiny_model_dir)},
                                    "data": {"train": [{"path": str(tmp_path / "d.jsonl")}], "max_seq_length": 128},
                                    "train": {"max_steps": 1, "gradient_checkpointing": True,
                                              "activation_offloading": True}}))
    notes = {}
    for ram in ("64GiB", "1MiB"):
        assert main(["plan", str(path), "--gpu-memory", "8GiB", "--host-memory", ram, "--format", "json"]) == 0
        notes[ram] = [n for n in json.loads(capsys.readouterr().out)["notes"] if "outgrow the machine" in n]
    assert notes["64GiB"] == [] and "the machine's 1.00 MiB of RAM" in notes["1MiB"][0]
