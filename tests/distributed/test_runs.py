"""Two real processes through `ftune run` (accelerate launch, gloo on CPU): DDP, FSDP v2 and FSDP v1 (full and LoRA).

Each distributed run is compared with a one-process run over the same global batch (2 x 2 vs 1 x 4):
the logged losses must agree within LOSS_RTOL, the ranks must see different data, the wrapping must
be real (DDP module, FSDP units, DTensor shards), final/ must reload as a normal HF/PEFT folder with
the same weights as the one-process run, and a sharded checkpoint must resume to the same losses.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from ftune.rundir import RunDir

from tests.bounds import weights_agree
from tests.e2e._util import ftune, losses, write_recipe

pytestmark = pytest.mark.distributed

# Stated tolerance: DDP/FSDP average the same per-token losses in a different order (all-reduce /
# reduce-scatter), so float32 sums differ in the last bits; measured differences are below 1e-6.
LOSS_RTOL = 1e-4
LR = 1e-2  # AdamW with TrainingArguments' betas (no optimizer_args) and no weight decay: tests/bounds.py
STEPS = 4
LORA = {"method": "lora", "r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
FULL = {"method": "full"}
STRATEGIES = {
    "ddp": {"strategy": "ddp", "num_processes": 2},
    "fsdp2": {"strategy": "fsdp", "num_processes": 2},
    "fsdp1": {"strategy": "fsdp", "num_processes": 2, "fsdp": {"version": 1}},
    # FSDP-native activation checkpointing renames modules (`_checkpoint_wrapped_module.`)
    "fsdp2ac": {"strategy": "fsdp", "num_processes": 2, "fsdp": {"activation_checkpointing": True}},
    # tensor parallelism: both ranks hold half of every split matrix and read the same batch (one data-parallel
    # rank), so the one-process run's batch of 4 is theirs; transformers can't checkpoint a model split at load
    "tp2": {"strategy": "ddp", "num_processes": 2, "parallelism": {"tp": 2}},
}
CASES = [("ddp", "lora"), ("fsdp2", "lora"), pytest.param("ddp", "full", marks=pytest.mark.extended),
         ("fsdp2", "full"), ("fsdp1", "full"), ("fsdp1", "lora"), ("fsdp2ac", "lora")]
"""ddp + full is `extended` (make test-all): DDP is proven by ddp + lora, full fine-tuning under two processes by
fsdp2 and fsdp1 + full; it cost about 25 s of make test's 2-core budget."""


def recipe(model_dir: Path, data_file: Path, out: Path, peft: dict, distributed: dict, batch: int,
           **extra) -> dict:
    r = {
        "name": "dist",
        "model": {"path": str(model_dir), "dtype": "float32"},
        "data": {"train": [{"path": str(data_file), "format": "text", "limit": 64}], "max_seq_length": 32},
        "peft": peft,
        "distributed": distributed,
        "train": {"max_steps": STEPS, "per_device_batch_size": batch, "learning_rate": LR, "logging_steps": 1,
                  "seed": 3, "lr_scheduler": "constant"},
        "checkpoint": {"strategy": "steps", "steps": 2, "keep": 3},
        "output": {"dir": str(out), "report_to": ["none"], "loss_curve": False},
    }
    r.update(extra)
    return r


@pytest.fixture(scope="module")
def runner(tmp_path_factory, tiny_model_dir, text_data_file):
    """run(kind, method) → run dir; each run happens once per module and is shared by the tests."""
    root = tmp_path_factory.mktemp("dist")

    @cache
    def run(kind: str, method: str, resume_from: str | None = None) -> Path:
        peft = LORA if method == "lora" else FULL
        name = f"{kind}-{method}" + ("-resumed" if resume_from else "")
        out = root / name
        distributed, batch = ({"strategy": "none"}, 4) if kind == "one" else (STRATEGIES[kind], 2)
        extra = {"checkpoint": {"strategy": "steps", "steps": 2, "resume": resume_from}} if resume_from else {}
        if kind == "tp2":
            batch, extra = 4, {"checkpoint": {"strategy": "no"}}
        r = recipe(tiny_model_dir, text_data_file, out, peft, distributed, batch, **extra)
        path = write_recipe(root, r, name=f"{name}.yaml")
        # FTUNE_RECORD_FACTS: the workers write distributed.rank<N>.json (test instrumentation, off in real runs)
        res = ftune("run", str(path), cwd=root, env={"OMP_NUM_THREADS": "1", "FTUNE_RECORD_FACTS": "1"}, timeout=400)
        assert res.code == 0, res.text[-3000:]
        return out

    return run


def facts(run_dir: Path) -> list[dict]:
    return [json.loads(RunDir(run_dir).rank_facts(r).read_text()) for r in (0, 1)]


def reload(final: Path, model_dir: Path, method: str):
    from transformers import AutoModelForCausalLM

    if method == "lora":
        from peft import PeftModel

        return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), str(final)).merge_and_unload()
    return AutoModelForCausalLM.from_pretrained(final)


def trained_tensors(final: Path, model_dir: Path, method: str) -> dict:
    """What the optimizer trained: the adapter's A/B tensors (LoRA) or the model's weights (full)."""
    if method == "lora":
        from safetensors.torch import load_file

        return load_file(str(final / "adapter_model.safetensors"))
    return reload(final, model_dir, method).state_dict()


@pytest.mark.parametrize(("kind", "method"), CASES)
def test_two_processes_really_distributed(runner, kind, method):
    run_dir = runner(kind, method)
    ranks = facts(run_dir)
    assert [f["rank"] for f in ranks] == [0, 1]
    assert all(f["world_size"] == 2 and f["backend"] == "gloo" for f in ranks)
    # the ranks see different data (each its half of the global batch)
    assert ranks[0]["first_batch_sha1"] != ranks[1]["first_batch_sha1"]
    assert ranks[0]["first_batch_shape"][0] == ranks[1]["first_batch_shape"][0] == 2
    for f in ranks:
        if kind == "ddp":
            assert f["wrapper"] == "DistributedDataParallel" and f["fsdp_units"] == 0
        elif kind.startswith("fsdp2"):
            assert f["distributed_type"] == "FSDP" and f["fsdp_version"] == 2
            assert "FSDPLlamaDecoderLayer" in f["fsdp_unit_classes"]
            assert f["fsdp_units"] >= 3  # two decoder layers + the root
            assert f["dtensor_params"] == f["params"] > 0  # every parameter is a DTensor shard
            assert f["local_numel"] < 0.6 * f["full_numel"]  # each rank holds about half
        else:
            assert f["distributed_type"] == "FSDP" and f["fsdp_version"] == 1
            assert f["fsdp_unit_classes"] == ["FullyShardedDataParallel"]
            assert f["fsdp_units"] >= 3


@pytest.mark.parametrize(("kind", "method"), CASES)
def test_losses_match_one_process(runner, kind, method):
    reference = losses(runner("one", method))
    got = losses(runner(kind, method))
    assert len(got) == len(reference) == STEPS
    assert got == pytest.approx(reference, rel=LOSS_RTOL)
    assert len(set(reference)) > 1  # the model trains: losses move


@pytest.mark.parametrize(("kind", "method"), CASES)
def test_final_reloads_with_the_trained_weights(runner, kind, method, tiny_model_dir):
    import torch

    final = runner(kind, method) / "final"
    assert (final / "ftune_complete.json").is_file()
    files = {p.name for p in final.iterdir()}
    assert ("adapter_model.safetensors" in files) == (method == "lora")
    assert not any("fsdp" in name or name.startswith("pytorch_model_fsdp") for name in files)
    got = reload(final, tiny_model_dir, method).state_dict()  # reloads as a plain HF/PEFT folder
    base = reload(tiny_model_dir, tiny_model_dir, "full").state_dict()
    assert set(got) == set(base)
    assert any(not torch.equal(got[n], base[n]) for n in base)  # trained, not the base weights
    weights_agree(trained_tensors(final, tiny_model_dir, method),
                  trained_tensors(runner("one", method) / "final", tiny_model_dir, method),
                  base if method == "full" else None, steps=STEPS, lr=LR)


@pytest.mark.parametrize(("kind", "method", "layout"), [("fsdp2", "lora", "pytorch_model_fsdp_0"),
                                                       ("fsdp2", "full", "pytorch_model_fsdp_0"),
                                                       ("fsdp2ac", "lora", "pytorch_model_fsdp.bin")])
def test_checkpoint_resumes(runner, kind, method, layout):
    """Sharded (DCP) checkpoints resume; adapters under FSDP checkpointing use a full adapter file."""
    first = runner(kind, method)
    ckpt = first / "checkpoints" / "checkpoint-2"
    assert (ckpt / layout).exists()
    resumed = runner(kind, method, resume_from=str(ckpt))
    steps = [json.loads(line)["step"] for line in (resumed / "metrics.jsonl").read_text().splitlines()
             if '"loss"' in line]
    assert steps[-1] == STEPS and 1 not in steps and 2 not in steps  # continued after step 2
    assert losses(resumed)[-2:] == pytest.approx(losses(first)[2:], rel=LOSS_RTOL)


def test_tensor_parallel_matches_one_process(runner, tiny_model_dir):
    """distributed.parallelism.tp 2 on 2 CPU processes (gloo, DTensor): the layers really split, one batch per tp
    group, the losses and final/ of one process."""
    run_dir = runner("tp2", "full")
    ranks = facts(run_dir)
    assert [r["world_size"] for r in ranks] == [2, 2]
    for r in ranks:
        assert not r["ddp"] and r["dtensor_params"] > 0  # split by the tp_plan, not replicated under DDP
        assert r["local_numel"] < r["full_numel"]
    assert ranks[0]["first_batch_sha1"] == ranks[1]["first_batch_sha1"]
    assert losses(run_dir) == pytest.approx(losses(runner("one", "full")), rel=LOSS_RTOL)
    weights_agree(reload(run_dir / "final", tiny_model_dir, "full").state_dict(),
                  reload(runner("one", "full") / "final", tiny_model_dir, "full").state_dict(),
                  reload(tiny_model_dir, tiny_model_dir, "full").state_dict(), steps=STEPS, lr=LR)


def test_unknown_wrap_class_is_refused_before_launch(tmp_path, tiny_model_dir, text_data_file):
    dist = {"strategy": "fsdp", "num_processes": 2, "fsdp": {"transformer_layer_cls": ["GPT2Block"]}}
    r = recipe(tiny_model_dir, text_data_file, tmp_path / "out", LORA, dist, 2)
    res = ftune("run", str(write_recipe(tmp_path, r)), cwd=tmp_path)
    assert res.code == 1
    assert "wrap class GPT2Block not found in LlamaForCausalLM" in res.text
    assert "LlamaDecoderLayer" in res.text


@pytest.mark.parametrize(("kind", "method"), [("fsdp2", "lora"), ("fsdp1", "full"), ("ddp", "lora"),
                                             ("fsdp2ac", "lora"), ("fsdp1", "lora")])
def test_checkpoints_read_back_and_match_the_model(runner, kind, method, tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from ftune.errors import RunError
    from ftune.worker.verify import checkpoint_tensors, verify_checkpoint

    ckpt = runner(kind, method) / "checkpoints" / "checkpoint-2"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    if method == "lora":
        model = get_peft_model(model, LoraConfig(r=LORA["r"], target_modules=LORA["target_modules"]))
    found = checkpoint_tensors(ckpt)
    assert len(found) == (8 if method == "lora" else len(list(model.parameters())))
    verify_checkpoint(ckpt, model, is_adapter=method == "lora")
    if method == "lora":  # a model that trains more than the checkpoint holds is refused
        bigger = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                                LoraConfig(r=LORA["r"], target_modules=["q_proj", "v_proj", "k_proj"]))
        with pytest.raises(RunError, match="checkpoint check failed.*missing.*k_proj"):
            verify_checkpoint(ckpt, bigger, is_adapter=True)
