"""The Plan's FSDP2 mixed-precision policy for preference objectives: bf16/fp16 parameters and gradient reduction as
accelerate sets them, outputs (TRL's per-token log-probs) left uncast; accelerate's own policy everywhere else."""

from __future__ import annotations

import pytest

from ftune.plan.compile import compile_plan
from ftune.recipe import load_recipe

from tests.unit.test_preference import _write

FSDP2 = {"strategy": "fsdp", "num_processes": 2}


def plan(tmp_path, train: dict, data: dict | None = None, **top):
    """Planned for 2 GPUs (fp16 is refused on CPU), as on a laptop planning a GPU job."""
    return compile_plan(load_recipe(_write(tmp_path, train, data, **top)), check_inputs=False, gpus=2)


@pytest.mark.parametrize("mp", ["bf16", "fp16"])
def test_fsdp2_preference_keeps_the_outputs_uncast(tmp_path, mp):
    p = plan(tmp_path, {"objective": "dpo", "mixed_precision": mp}, distributed=FSDP2, peft={"method": "lora"})
    low = {"bf16": "bfloat16", "fp16": "float16"}[mp]
    assert p.fsdp_mixed_precision == {"param_dtype": low, "reduce_dtype": low, "output_dtype": None}
    assert any(n.startswith(f"fsdp {mp}: dpo log-probs stay float32") for n in p.notes)


@pytest.mark.parametrize(("train", "distributed"), [
    ({"objective": "sft", "mixed_precision": "bf16"}, FSDP2),  # SFT's logits would double in memory
    ({"objective": "dpo"}, FSDP2),  # float32: nothing is cast
    ({"objective": "dpo", "mixed_precision": "bf16"}, {**FSDP2, "fsdp": {"version": 1}}),  # v1 casts no outputs
    ({"objective": "dpo", "mixed_precision": "bf16"}, {"strategy": "ddp", "num_processes": 2}),  # autocast
])
def test_accelerate_policy_elsewhere(tmp_path, train, distributed):
    data = {"train": [{"path": "t.jsonl", "format": "text"}]} if train["objective"] == "sft" else None
    p = plan(tmp_path, train, data, distributed=distributed)
    assert p.fsdp_mixed_precision is None
    assert not any("log-probs stay float32" in n for n in p.notes)


def test_worker_sets_the_policy_on_the_fsdp_plugin(tmp_path):
    import torch
    from types import SimpleNamespace

    from ftune.runtime.precision import set_mixed_precision_policy

    p = plan(tmp_path, {"objective": "dpo", "mixed_precision": "bf16"}, distributed=FSDP2)
    plugin = SimpleNamespace(mixed_precision_policy=None)
    set_mixed_precision_policy(SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin)), p)
    policy = plugin.mixed_precision_policy
    assert (policy.param_dtype, policy.reduce_dtype, policy.output_dtype) == (torch.bfloat16, torch.bfloat16, None)
    untouched = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=None))  # DDP: no plugin, nothing to set
    set_mixed_precision_policy(untouched, p)
