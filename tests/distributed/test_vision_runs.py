"""A vision-language model under FSDP on two real processes (#26): the tiny LLaVA (CLIP vision tower, projector,
Llama) through `ftune run` with `distributed.strategy: fsdp` and gradient checkpointing, against the same global
batch on one process (2 x 2 vs 1 x 4).

Proved: world size 2 over gloo; FSDP units around both towers' layers (the vision encoder's and the language
decoder's, the classes the Plan names); each rank reads its own half of the batch; the losses agree within
LOSS_RTOL; the frozen vision tower stays the base's bit for bit (not in the adapter, and the reloaded model's vision
tensors equal the base's) while the projector and the LoRA matrices moved, to the one-process run's values within
WEIGHT_ATOL.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftune.rundir import RunDir

from tests.e2e._util import ftune, losses, write_recipe
from tests.vision_data import colour_rows

pytestmark = [pytest.mark.distributed, pytest.mark.extended]

# Stated tolerance, as tests/distributed/test_runs.py: FSDP reduce-scatters the same per-token losses in another
# order, so float32 sums differ in the last bits (measured: losses 2.0e-7 relative, adapter tensors 9.1e-7).
LOSS_RTOL = 1e-4
WEIGHT_ATOL = 1e-5
STEPS = 3


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    """The colour task, each question numbered: two rows of one colour are otherwise the same tokens and the same
    pixels, so two ranks that drew the same colours in the same order showed the same first batch (the data-split
    check failed on main for that alone: both ranks' batches were red, green by other rows)."""
    path = colour_rows(tmp_path_factory.mktemp("vdata"), 24)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for i, row in enumerate(rows):
        row["messages"][0]["content"][1]["text"] += f" {i}"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _recipe(vlm_dir: Path, data: Path, out: Path, distributed: dict, batch: int) -> dict:
    return {"schema_version": 1, "name": "vlm-dist",
            "model": {"path": str(vlm_dir), "task": "image-text-to-text", "dtype": "float32"},
            "data": {"train": [{"path": str(data), "format": "vision-chat"}], "max_seq_length": 32},
            "peft": {"method": "lora", "r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear"},
            "distributed": distributed,
            "train": {"max_steps": STEPS, "learning_rate": 1e-2, "per_device_batch_size": batch, "logging_steps": 1,
                      "seed": 3, "lr_scheduler": "constant", "gradient_checkpointing": True},
            "checkpoint": {"strategy": "no"},
            "output": {"dir": str(out), "report_to": ["none"], "loss_curve": False}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, vlm_dir, data_file) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vdist")
    out = {}
    for kind, distributed, batch in (("one", {"strategy": "none"}, 4),
                                     ("fsdp", {"strategy": "fsdp", "num_processes": 2}, 2)):
        path = write_recipe(root, _recipe(vlm_dir, data_file, root / kind, distributed, batch), name=f"{kind}.yaml")
        res = ftune("run", str(path), cwd=root, timeout=400,
                    env={"OMP_NUM_THREADS": "1", "FTUNE_RECORD_FACTS": "1", "FTUNE_CACHE": str(root / "cache")})
        assert res.code == 0, res.text[-3000:]
        out[kind] = root / kind
    return out


def test_fsdp_wraps_both_towers_and_splits_the_data(runs):
    plan = json.loads(RunDir(runs["fsdp"]).plan.read_text())
    wrap = plan["launch"]["accelerate_config"]["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"].split(",")
    assert {"CLIPEncoderLayer", "LlamaDecoderLayer"} <= set(wrap)  # the Plan names both towers' layer classes
    ranks = [json.loads(RunDir(runs["fsdp"]).rank_facts(r).read_text()) for r in (0, 1)]
    assert [f["rank"] for f in ranks] == [0, 1]
    for f in ranks:
        assert f["world_size"] == 2 and f["backend"] == "gloo"
        assert f["distributed_type"] == "FSDP" and f["fsdp_version"] == 2
        assert {"FSDPCLIPEncoderLayer", "FSDPLlamaDecoderLayer"} <= set(f["fsdp_unit_classes"])
        assert f["fsdp_units"] >= 1 + 2 + 1  # the vision layer, the two decoder layers, the root
        assert f["dtensor_params"] == f["params"] > 0
        # gradient checkpointing on both towers: CLIP's encoder + its layer, Llama's model + its 2 layers
        assert f["hf_checkpointing_layers"] >= 5
        assert f["first_batch_shape"][0] == 2
    assert ranks[0]["first_batch_sha1"] != ranks[1]["first_batch_sha1"]  # each rank its half of the batch


def test_losses_match_one_process(runs):
    reference, got = losses(runs["one"]), losses(runs["fsdp"])
    assert len(got) == len(reference) == STEPS and len(set(reference)) > 1
    assert got == pytest.approx(reference, rel=LOSS_RTOL)


def test_frozen_tower_bit_identical_trained_parts_moved_as_on_one_process(runs, vlm_dir):
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    from ftune.models.vision_parts import part_of

    adapter = load_file(str(RunDir(runs["fsdp"]).final / "adapter_model.safetensors"))
    assert not [n for n in adapter if part_of(n, "llava") == "vision"]  # frozen: not saved, the base's is used
    one = load_file(str(RunDir(runs["one"]).final / "adapter_model.safetensors"))
    assert set(adapter) == set(one)
    for name in one:
        torch.testing.assert_close(adapter[name], one[name], atol=WEIGHT_ATOL, rtol=1e-4, msg=name)

    base = AutoModelForImageTextToText.from_pretrained(vlm_dir).state_dict()
    tuned = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(vlm_dir),
                                      str(RunDir(runs["fsdp"]).final)).merge_and_unload().state_dict()
    assert set(tuned) == set(base)
    by_part: dict[str, list[bool]] = {"vision": [], "projector": [], "language": []}
    for name, tensor in base.items():
        by_part[part_of(name, "llava")].append(torch.equal(tuned[name], tensor))
    assert by_part["vision"] and all(by_part["vision"])  # bit for bit
    assert not any(by_part["projector"])  # trained whole: every tensor moved
    assert not all(by_part["language"])  # LoRA merged into the attention and MLP weights
