"""`distributed.parallelism` (ftune.plan.parallelism): what the compiler decides (the worker's DistributedConfig /
ParallelismConfig, the data-parallel batch) and every combination it refuses, located, with the reason; and the
memory per device under tp / cp with the longest row that fits (ftune.estimate.parallel), by hand."""

from __future__ import annotations

import json

import pytest
import yaml

from ftune.errors import RecipeError
from ftune.estimate.memory import DeviceMemory
from ftune.estimate.facts import MemoryItem
from ftune.estimate.parallel import longest_sequence, split
from ftune.plan.compile import compile_plan
from ftune.recipe import load_recipe
from ftune.tiny import CONFIG

TP2 = {"strategy": "ddp", "num_processes": 2, "parallelism": {"tp": 2}}


def _recipe(tmp_path, distributed: dict, config: dict | None = None, **sections):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(config or CONFIG))  # heads 4, kv-heads 2, MLP 128
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "hello"}\n')
    recipe = {"name": "unit", "model": {"path": str(model)}, "data": {"train": [{"path": str(data)}],
                                                                      "max_seq_length": 64},
              "peft": {"method": "full"}, "distributed": distributed,
              "train": {"max_steps": 10, "per_device_batch_size": 4, "gradient_accumulation_steps": 2},
              "checkpoint": {"strategy": "no"}, "output": {"dir": str(tmp_path / "runs" / "unit")}}
    for key, value in sections.items():
        recipe[key] = value if not isinstance(value, dict) else {**recipe.get(key, {}), **value}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return load_recipe(path)


def _errors(tmp_path, distributed, gpus=None, **sections) -> str:
    with pytest.raises(RecipeError) as err:
        compile_plan(_recipe(tmp_path, distributed, **sections), environ={}, gpus=gpus)
    return err.value.render()


def test_tp_decides_the_load_and_the_data_parallel_batch(tmp_path):
    plan = compile_plan(_recipe(tmp_path, TP2), environ={})
    assert plan.parallelism.tp == 2 and plan.parallelism.dp == 1
    assert plan.model_load.distributed == {"tp_size": 2, "fsdp_size": 1}
    assert plan.world_size == 2
    assert plan.effective_batch_size == 4 * 2 * 1  # both ranks read the same batch: one data-parallel rank
    assert plan.data.step_samples == 8 and plan.data.pad_to_multiple_of is None
    assert plan.parallelism.accelerate_kwargs() == {"dp_replicate_size": 1, "dp_shard_size": 1, "tp_size": 2,
                                                    "cp_size": 1}
    assert any("tp 2: weights split at load" in n for n in plan.notes)


def test_tp_by_dp_shard_loads_with_transformers_fsdp(tmp_path):
    plan = compile_plan(_recipe(tmp_path, {"strategy": "ddp", "num_processes": 4,
                                           "parallelism": {"tp": 2, "dp_shard": 2}}), environ={})
    assert plan.model_load.distributed == {"tp_size": 2, "fsdp_size": 2}
    assert plan.effective_batch_size == 4 * 2 * 2


def test_cp_on_gpus_plans_sdpa_and_fsdp2(tmp_path):
    plan = compile_plan(_recipe(tmp_path, {"strategy": "fsdp", "num_processes": 4,
                                           "parallelism": {"dp_shard": 2, "cp": 2}}), environ={}, gpus=4)
    assert plan.model_load.kwargs["attn_implementation"] == "sdpa" and plan.model_load.distributed is None
    assert plan.data.pad_to_multiple_of == 4  # every batch splits into 2 x cp chunks
    assert plan.effective_batch_size == 4 * 2 * 2


def test_sizes_must_multiply_to_the_world(tmp_path):
    text = _errors(tmp_path, {"strategy": "ddp", "num_processes": 2, "parallelism": {"tp": 4}})
    assert "recipe.yaml:" in text and "distributed.parallelism: dp_replicate 1 x dp_shard 1 x tp 4 x cp 1 = 4, " \
        "but the job has 2 process(es)" in text


@pytest.mark.parametrize(("distributed", "sections", "expected"), [
    ({"strategy": "fsdp", "num_processes": 2, "parallelism": {"tp": 2}}, {},
     "distributed.strategy: tp: distributed.strategy must be ddp, not fsdp"),
    (TP2, {"checkpoint": {"strategy": "steps"}}, "checkpoint.strategy: tensor parallelism shards the model"),
    (TP2, {"peft": {"method": "lora", "r": 4}}, "peft.method: lora with tensor parallelism"),
    ({"strategy": "ddp", "num_processes": 2, "parallelism": {"dp_shard": 2}}, {},
     "distributed.strategy: dp_shard shards parameters: it needs distributed.strategy fsdp (version 2), not ddp"),
    ({"strategy": "fsdp", "num_processes": 2, "fsdp": {"version": 1}, "parallelism": {"dp_shard": 2}}, {},
     "distributed.fsdp.version: distributed.parallelism needs FSDP version 2"),
    ({"strategy": "fsdp", "num_processes": 2, "parallelism": {"dp_replicate": 2}}, {},
     "distributed.parallelism.dp_shard: FSDP2 shards over dp_shard (x cp), and both are 1"),
    ({"strategy": "deepspeed", "num_processes": 2, "parallelism": {"dp_shard": 2}}, {},
     "distributed.strategy: distributed.parallelism with DeepSpeed"),
    ({"strategy": "ddp", "num_processes": 4, "parallelism": {"tp": 2, "dp_replicate": 2}}, {},
     "distributed.parallelism.dp_replicate: tp/cp with pure data-parallel replicas"),
    ({"strategy": "ddp", "num_processes": 4, "parallelism": {"tp": 4}}, {},
     "distributed.parallelism.tp: tp 4 does not divide the model's num_key_value_heads (2)"),
    ({"strategy": "fsdp", "num_processes": 2, "parallelism": {"cp": 2}}, {},
     "distributed.parallelism.cp: context parallelism needs CUDA"),
])
def test_refused_located_with_the_reason(tmp_path, distributed, sections, expected):
    text = _errors(tmp_path, distributed, **sections)
    assert expected in text, text
    assert "hint:" in text and "Traceback" not in text


def test_cp_needs_sdpa_and_a_divisible_length_on_gpus(tmp_path):
    text = _errors(tmp_path, {"strategy": "fsdp", "num_processes": 2, "parallelism": {"cp": 2}}, gpus=2,
                   model={"attn_implementation": "eager"}, data={"max_seq_length": 66})
    assert "model.attn_implementation: context parallelism with eager attention" in text
    assert "data.max_seq_length: context parallelism over 2 ranks splits each sequence into 2 x 2 = 4" in text
    assert "needs CUDA" not in text  # planned for GPUs


def test_tp_needs_a_model_with_a_plan(tmp_path):
    config = {**CONFIG, "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_layer": 2,
              "n_head": 4, "vocab_size": 384, "n_positions": 512}
    with pytest.raises(RecipeError) as err:
        compile_plan(_recipe(tmp_path, TP2, config=config), environ={})
    assert "distributed.parallelism.tp: gpt2 has no tensor-parallel plan" in err.value.render()


# ------------------------------------------------------------------ memory per device, by hand
MIB = 2**20


def _memory() -> DeviceMemory:
    """One rank before tp/cp: weights 400 MiB, gradients 400 (update), Adam 800, activations 300 and the head's
    gradients 100 (backward), update scratch 40 (update). Peak = always 1200 + max(backward 400, update 440)."""
    items = (MemoryItem("weights", "bfloat16", 400 * MIB), MemoryItem("gradients", "bfloat16", 400 * MIB, "update"),
             MemoryItem("optimizer", "AdamW", 800 * MIB), MemoryItem("activations", "saved", 300 * MIB, "backward"),
             MemoryItem("temporary", "head gradients", 100 * MIB, "backward"),
             MemoryItem("temporary", "optimizer update scratch", 40 * MIB, "update"))
    return DeviceMemory(items, "update", 1640 * MIB, 0)


def test_fixed_buffers_are_not_divided():
    workspace = MemoryItem("temporary", "cuBLAS workspaces", 64 * MIB)  # phase always: one per device
    m = split(DeviceMemory((*_memory().items, workspace), "update", 1704 * MIB, 0), tp=8, cp=2)
    assert {i.detail: i.bytes // MIB for i in m.items}["cuBLAS workspaces"] == 64


def test_split_divides_states_by_tp_and_activations_by_tp_and_cp():
    m = split(_memory(), tp=2, cp=2)
    got = {i.detail: i.bytes // MIB for i in m.items}
    assert got == {"bfloat16": 200, "AdamW": 400, "saved": 75, "head gradients": 25, "optimizer update scratch": 20}
    # always 600 + max(backward 75 + 25 = 100, update 200 + 20 = 220)
    assert (m.total // MIB, m.peak_phase) == (820, "update")
    sharded = split(_memory(), tp=2, load_shard=2)  # tp x dp_shard at load: states / 4, activations / 2
    assert {i.detail: i.bytes // MIB for i in sharded.items}["AdamW"] == 200
    assert sharded.total // MIB == 100 + 200 + max(150 + 50, 100 + 10)


def test_longest_sequence_that_fits_by_hand():
    # at 1,024 tokens the sequence part is 400 MiB (activations 300 + head 100): 400/1024 MiB per token.
    # 2 GiB: always 1200, nothing else fixed in backward -> room 848 MiB -> 848 * 1024 / 400 = 2170.88 -> 2170
    assert longest_sequence(_memory(), 1024, 2048 * MIB) == 2170
    assert longest_sequence(_memory(), 1024, 2048 * MIB, multiple=4) == 2168  # cp 2: a multiple of 2 x cp
    # after tp 2 x cp 2 the per-token part is 100/1024 MiB and always 600: room 1448 -> 14,827.52 -> 14,827
    assert longest_sequence(split(_memory(), tp=2, cp=2), 1024, 2048 * MIB) == 14827
    assert longest_sequence(_memory(), 1024, 1600 * MIB) == 0  # always + update (1640) don't fit at any length
