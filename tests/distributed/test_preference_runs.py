"""DPO + LoRA on two real processes through `ftune run` (accelerate launch, gloo on CPU): DDP and FSDP v2.

Each 2-process run (2 pairs per process) is compared with a one-process run over the same global batch (4 pairs):
the logged DPO loss and TRL's reward metrics must agree within RTOL, the ranks must see different pairs, the
wrapping must be real, and final/ must hold one plain adapter with the one-process run's weights.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from ftune.rundir import RunDir

from tests.distributed.test_runs import LORA
from tests.e2e._util import ftune, metrics, write_recipe
from tests.e2e.test_preference import preference_rows

pytestmark = [pytest.mark.distributed,
              pytest.mark.skipif(__import__("importlib").util.find_spec("trl") is None,
                                 reason="needs trl (pip install 'ftune[preference]')")]

# Stated tolerance: the processes score the same pairs; only the order of the all-reduce / reduce-scatter sums
# and the padding of a batch of 2 instead of 4 differ, which moves float32 results in the last bits.
RTOL = 1e-4
ATOL = 1e-6  # rewards/margins start at exactly 0 (policy == reference at step 1)
WEIGHT_ATOL = 1e-5
STEPS = 3
# per-step metrics compared with the one-process run: TRL's (each gathered over the processes before logging) and
# the Trainer's loss and gradient norm (what clipping sees: under FSDP, computed from the sharded gradients)
COMPARED = ("loss", "grad_norm", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
            "logps/chosen", "logps/rejected")
STRATEGIES = {
    "one": {"strategy": "none"},
    "ddp": {"strategy": "ddp", "num_processes": 2},
    "fsdp2": {"strategy": "fsdp", "num_processes": 2},
}


def recipe(model_dir: Path, data_file: Path, out: Path, kind: str) -> dict:
    return {
        "name": "dist-dpo",
        "model": {"path": str(model_dir), "dtype": "float32"},
        "data": {"train": [{"path": str(data_file), "format": "preference"}], "max_seq_length": 32},
        "peft": LORA,
        "distributed": STRATEGIES[kind],
        "train": {"objective": "dpo", "preference": {"beta": 0.1}, "max_steps": STEPS,
                  "per_device_batch_size": 4 if kind == "one" else 2, "learning_rate": 2e-2, "logging_steps": 1,
                  "seed": 3, "lr_scheduler": "constant", "warmup_steps": 0},
        "checkpoint": {"strategy": "no"},
        "output": {"dir": str(out), "report_to": ["none"], "loss_curve": False},
    }


@pytest.fixture(scope="module")
def runner(tmp_path_factory, tiny_model_dir):
    """run(kind) → run dir; each run happens once per module and is shared by the tests."""
    root = tmp_path_factory.mktemp("dist-dpo")
    data = root / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in preference_rows(48, seed=11)))

    @cache
    def run(kind: str) -> Path:
        out = root / kind
        path = write_recipe(root, recipe(tiny_model_dir, data, out, kind), name=f"{kind}.yaml")
        # FTUNE_RECORD_FACTS: the workers write distributed.rank<N>.json (test instrumentation, off in real runs)
        res = ftune("run", str(path), cwd=root, env={"OMP_NUM_THREADS": "1", "FTUNE_RECORD_FACTS": "1"}, timeout=400)
        assert res.code == 0, res.text[-3000:]
        return out

    return run


def logged(run_dir: Path) -> list[dict]:
    return [m for m in metrics(run_dir) if "loss" in m]


@pytest.mark.parametrize("kind", ["ddp", "fsdp2"])
def test_dpo_runs_on_two_processes(runner, kind):
    ranks = [json.loads(RunDir(runner(kind)).rank_facts(r).read_text()) for r in (0, 1)]
    assert [f["rank"] for f in ranks] == [0, 1]
    assert all(f["world_size"] == 2 and f["backend"] == "gloo" for f in ranks)
    # each rank its own 2 pairs; TRL's collator stacks chosen then rejected: 4 sequences
    assert ranks[0]["first_batch_sha1"] != ranks[1]["first_batch_sha1"]
    assert ranks[0]["first_batch_shape"][0] == ranks[1]["first_batch_shape"][0] == 4
    for f in ranks:
        if kind == "ddp":
            assert f["wrapper"] == "DistributedDataParallel" and f["fsdp_units"] == 0
        else:
            assert f["distributed_type"] == "FSDP" and f["fsdp_version"] == 2
            assert "FSDPLlamaDecoderLayer" in f["fsdp_unit_classes"] and f["fsdp_units"] >= 3
            assert f["dtensor_params"] == f["params"] > 0
            assert f["local_numel"] < 0.6 * f["full_numel"]


@pytest.mark.parametrize("kind", ["ddp", "fsdp2"])
def test_dpo_losses_and_rewards_match_one_process(runner, kind):
    want, got = logged(runner("one")), logged(runner(kind))
    assert [m["step"] for m in got] == [m["step"] for m in want] == list(range(1, STEPS + 1))
    for key in COMPARED:
        assert [m[key] for m in got] == pytest.approx([m[key] for m in want], rel=RTOL, abs=ATOL), key
    # the comparison has teeth: step 1 is log 2 with zero margins (policy == reference), then the policy moves
    assert want[0]["loss"] == pytest.approx(0.693147, abs=1e-5) and want[0]["rewards/margins"] == 0
    assert want[-1]["loss"] < want[0]["loss"] - 1e-3 and want[-1]["rewards/margins"] > 1e-3


@pytest.mark.parametrize("kind", ["ddp", "fsdp2"])
def test_dpo_final_is_one_plain_adapter_with_the_one_process_weights(runner, kind):
    from safetensors.torch import load_file

    final = runner(kind) / "final"
    assert (final / "ftune_complete.json").is_file()
    assert json.loads((final / "adapter_config.json").read_text())["r"] == LORA["r"]
    assert not (final / "ref").exists() and not any("fsdp" in p.name for p in final.iterdir())
    got = load_file(final / "adapter_model.safetensors")
    want = load_file(runner("one") / "final" / "adapter_model.safetensors")
    assert set(got) == set(want) and len(want) == 8  # 2 layers x (q, v) x (A, B), no `ref` tensors
    import torch

    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=WEIGHT_ATOL, rtol=1e-4, msg=name)
    assert all(float(want[n].abs().sum()) > 0 for n in want if "lora_B" in n)  # trained, not the zero init
