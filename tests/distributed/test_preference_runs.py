"""DPO + LoRA on two real processes through `ftune run` (accelerate launch, gloo on CPU): DDP and FSDP v2
(float32, and bf16 mixed precision).

Each 2-process run (2 pairs per process) is compared with a one-process run over the same global batch (4 pairs):
the logged DPO loss and TRL's reward metrics must agree within RTOL, the ranks must see different pairs, the
wrapping must be real, and final/ must hold one plain adapter with the one-process run's weights.
"""

from __future__ import annotations

import json
import math
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
    "fsdp2-bf16": {"strategy": "fsdp", "num_processes": 2},  # with train.mixed_precision: bf16
}
EVAL_PAIRS = 8  # evaluated once, after training: 2 full global batches of 4 in every layout (see docs/preference.md)


def recipe(model_dir: Path, data_file: Path, eval_file: Path, out: Path, kind: str) -> dict:
    return {
        "name": "dist-dpo",
        "model": {"path": str(model_dir), "dtype": "float32"},
        "data": {"train": [{"path": str(data_file), "format": "preference"}],
                 "eval": [{"path": str(eval_file), "format": "preference"}], "max_seq_length": 32},
        "peft": LORA,
        "distributed": STRATEGIES[kind],
        "train": {"objective": "dpo", "preference": {"beta": 0.1}, "max_steps": STEPS,
                  "per_device_batch_size": 4 if kind == "one" else 2, "learning_rate": 2e-2, "logging_steps": 1,
                  "seed": 3, "lr_scheduler": "constant", "warmup_steps": 0,
                  "mixed_precision": "bf16" if kind.endswith("bf16") else "no"},
        "checkpoint": {"strategy": "no"},
        "output": {"dir": str(out), "report_to": ["none"], "loss_curve": False},
    }


@pytest.fixture(scope="module")
def runner(tmp_path_factory, tiny_model_dir):
    """run(kind) → run dir; each run happens once per module and is shared by the tests."""
    root = tmp_path_factory.mktemp("dist-dpo")
    data = root / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in preference_rows(48, seed=11)))
    held_out = root / "eval.jsonl"
    held_out.write_text("".join(json.dumps(r) + "\n" for r in preference_rows(EVAL_PAIRS, seed=12)))

    @cache
    def run(kind: str) -> Path:
        out = root / kind
        path = write_recipe(root, recipe(tiny_model_dir, data, held_out, out, kind), name=f"{kind}.yaml")
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


def test_dpo_fsdp2_bf16_keeps_float32_log_probs(runner):
    """bf16 FSDP2 against the float32 one-process run. accelerate's FSDP2 policy casts the model's outputs to bf16,
    TRL's per-token log-probs included, so each sequence's log-prob was rounded to bf16 (steps of 0.25 here) before
    the reference's was subtracted: log 2 was logged as 0.6914 and the step-2 margin as 0.0625 (0.0548 in float32).
    The Plan leaves the outputs uncast. Stated tolerances: bf16 compute (parameters, gradient reduction) measured
    below 3e-4 on the losses, 6e-3 on the margins and 1e-4 on the log-probs."""
    run_dir = runner("fsdp2-bf16")
    plan = json.loads(RunDir(run_dir).plan.read_text())
    assert plan["mixed_precision"] == "bf16"
    assert plan["fsdp_mixed_precision"] == {"param_dtype": "bfloat16", "reduce_dtype": "bfloat16", "output_dtype": None}
    want, got = logged(runner("one")), logged(run_dir)
    assert len(got) == STEPS and got[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert [m["loss"] for m in got] == pytest.approx([m["loss"] for m in want], rel=1e-3)
    assert [m["rewards/margins"] for m in got] == pytest.approx([m["rewards/margins"] for m in want], rel=2e-2,
                                                                abs=ATOL)
    for key in ("logps/chosen", "logps/rejected"):
        assert [m[key] for m in got] == pytest.approx([m[key] for m in want], rel=5e-4), key


@pytest.mark.parametrize("kind", ["ddp", "fsdp2"])
def test_dpo_eval_matches_one_process(runner, kind):
    """The final evaluation: each process scores its half of the held-out pairs, the reference with the adapter
    disabled under the wrapper; finite, and equal to the one-process figures."""
    def final_eval(run_dir: Path) -> dict:
        (record,) = [m for m in metrics(run_dir) if "eval_loss" in m]
        return record

    want, got = final_eval(runner("one")), final_eval(runner(kind))
    for key in ("eval_loss", *(f"eval_{k}" for k in COMPARED if k not in ("loss", "grad_norm"))):
        assert got[key] == pytest.approx(want[key], rel=RTOL, abs=ATOL), key
    assert want["eval_loss"] < 0.69 and want["eval_rewards/margins"] > 1e-3  # the trained policy, not the start


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
