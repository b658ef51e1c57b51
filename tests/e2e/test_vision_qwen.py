"""The Qwen-VL families through the real CLI (#40): a tiny Qwen2-VL, Qwen2.5-VL and Qwen3-VL (`ftune.tiny_vision.
build_tiny_qwen_vl`) learn the colour task of tests/vision_data.py with LoRA (held-out exact match from chance to
>= 0.9, as LLaVA's test), with images of two sizes in each batch (dynamic resolution: a 28-pixel square is one
`<|image_pad|>`, a 56-pixel one four, so `image_grid_thw` and the M-RoPE positions differ within a batch); the frozen
tower is not in the adapter, the projector (`visual.merger`) trained whole; `ftune merge` checks the merged model
on image rows, and `ftune generate` on the merged folder names the colour of a red, a green and a blue square.
Qwen2-VL also: blank images stay at chance (the image reaches the model), and full fine-tuning with a frozen tower
(the tower bit-identical, final/ a whole model that `generate` reads, a checkpoint resumed), and FSDP over both
towers on 2 processes.

transformers 5.23 builds the Qwen-VL processor only with a video processor, which needs torchvision, and the
project's CPU torch 2.13 has none that loads: these tests skip without torchvision, and `make test-torchvision`
runs them in a side venv (.venv-tv: torch 2.14.1 + torchvision 0.29.1, docs/ci.md)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.e2e._util import ftune, metrics, write_recipe
from tests.vision_data import COLOURS, colour_rows

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    importlib.util.find_spec("torchvision") is None,
    reason="needs torchvision (transformers 5.23 builds Qwen-VL's processor with a video processor): "
           "`make test-torchvision` runs it in a venv with torch 2.14.1 + torchvision 0.29.1")]

ROWS, SIDES, STEPS = 150, (28, 56), 30
FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def _build(family: str, folder: Path, tokenizer_dir: Path) -> Path:
    from transformers import AutoTokenizer

    from ftune.tiny_vision import build_tiny_qwen_vl

    if not (folder / "config.json").exists():
        build_tiny_qwen_vl(folder, AutoTokenizer.from_pretrained(tokenizer_dir), family=family, image_size=max(SIDES))
    return folder


def _recipe(model: Path, data: Path, **sections) -> dict:
    return {"schema_version": 1, "name": "qwen-vl",
            "model": {"path": str(model), "task": "image-text-to-text", "dtype": "float32"},
            "data": {"train": [{"path": str(data), "format": "vision-chat"}], "eval": {"split": 0.2},
                     "max_seq_length": 64},
            "peft": {"method": "lora", "r": 8, "alpha": 16, "target_modules": "all-linear"},
            "train": {"max_steps": STEPS, "learning_rate": 1e-2, "per_device_batch_size": 8},
            "eval": {"strategy": "no", "generate": {"max_new_tokens": 6, "metrics": ["exact_match"]}},
            "checkpoint": {"strategy": "no"},
            "output": {"dir": "runs/r", "report_to": ["none"], "loss_curve": False}} | sections


def _run(folder: Path, recipe: dict, name: str = "recipe.yaml") -> Path:
    res = ftune("run", str(write_recipe(folder, recipe, name=name)), cwd=folder,
                env={"FTUNE_CACHE": str(folder / "cache")})
    assert res.code == 0, res.text[-4000:]
    return folder / recipe["output"]["dir"]


def _exact_match(run: Path) -> dict:
    return next(m for m in metrics(run) if "eval_exact_match" in m)


def _squares_file(folder: Path) -> Path:
    """rows.jsonl for `ftune generate --file`: a red 28-pixel square, a green 56-pixel one, a blue 28-pixel one."""
    from PIL import Image

    rows = []
    for (name, rgb), side in zip(COLOURS.items(), (28, 56, 28)):
        Image.new("RGB", (side, side), rgb).save(folder / f"{name}.png")
        rows.append({"messages": [{"role": "user", "content": [{"type": "image", "image": f"{name}.png"},
                                                               {"type": "text", "text": "what colour"}]}]})
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _generate(target: Path, folder: Path) -> list[str]:
    res = ftune("generate", str(target), "--file", str(_squares_file(folder)), "--batch-size", "3",
                "--max-new-tokens", "6", "--format", "json", cwd=folder)
    assert res.code == 0, res.text[-3000:]
    return [r["completion"] for r in json.loads(res.out)["results"]]


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_tokenizer_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("qwen-models")
    return {family: _build(family, root / family, tiny_tokenizer_dir) for family in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_each_qwen_family_learns_the_colour_then_merges_and_generates_with_images(family, models, tmp_path):
    from safetensors.torch import load_file

    from ftune.models.vision_parts import part_of

    # Qwen3-VL under gradient checkpointing: the frozen tower (which holds the projector) runs without autograd
    train = {"gradient_checkpointing": True} if family == "qwen3_vl" else {}
    recipe = _recipe(models[family], colour_rows(tmp_path, ROWS, sides=SIDES))
    run = _run(tmp_path, recipe | {"train": recipe["train"] | train})
    logged = _exact_match(run)
    assert logged["eval_generated"] == ROWS // 5 and logged["eval_exact_match"] >= 0.9, logged
    parts: dict[str, list[str]] = {"vision": [], "projector": [], "language": []}
    for name in load_file(str(run / "final" / "adapter_model.safetensors")):
        parts[part_of(name, family)].append(name)
    assert parts["vision"] == [] and parts["projector"] and parts["language"], {k: len(v) for k, v in parts.items()}

    res = ftune("merge", str(run), "--dtype", "float32", "--format", "json", cwd=tmp_path)
    assert res.code == 0, res.text[-3000:]
    merged = json.loads(res.out)
    assert merged["max_diff"] <= merged["tolerance"] and merged["images"] == 4, merged
    assert "image_grid_thw" in merged["sample_source"], merged  # the check ran the vision tower on image rows
    assert _generate(run / "merged", tmp_path) == list(COLOURS)


def test_blank_images_stay_at_chance(models, tmp_path):
    """The same run on white squares: the colour can't be read, so held-out exact match stays near 1/3 (30 rows:
    at most 0.6 allows for a lucky split; the colour run reaches >= 0.9)."""
    run = _run(tmp_path, _recipe(models["qwen2_vl"], colour_rows(tmp_path, ROWS, blank=True, sides=SIDES)))
    assert _exact_match(run)["eval_exact_match"] <= 0.6


def test_plan_counts_the_image_tokens_the_processor_makes(models, tmp_path, capsys, monkeypatch):
    """`ftune plan` plans a Qwen-VL image within the model folder's image processor's pixel budget (56 x 56 here:
    four `<|image_pad|>`, 16 patches), as the processor counts them, not the checkpoints' default of 16,384 tokens."""
    from PIL import Image
    from transformers import AutoProcessor

    from ftune.cli.main import main

    monkeypatch.chdir(tmp_path)
    data = colour_rows(tmp_path, 6, sides=SIDES)
    image = Image.new("RGB", (max(SIDES), max(SIDES)))
    for family in FAMILIES:
        path = write_recipe(tmp_path, _recipe(models[family], data), name=f"{family}.yaml")
        capsys.readouterr()
        assert main(["plan", str(path), "--format", "json"]) == 0
        planned = json.loads(capsys.readouterr().out)["estimate"]["vision"]["image"]
        processor = AutoProcessor.from_pretrained(models[family])
        grid = processor.image_processor(images=[image], return_tensors="pt")["image_grid_thw"][0].tolist()
        assert (planned["patches"], planned["tokens"]) == (grid[0] * grid[1] * grid[2], 4), (family, planned)


# ------------------------------------------------------------------ full fine-tuning
@pytest.fixture(scope="module")
def full_run(tmp_path_factory, models) -> Path:
    folder = tmp_path_factory.mktemp("qwen-full")
    recipe = _recipe(models["qwen2_vl"], colour_rows(folder, ROWS, sides=SIDES),
                     peft={"method": "full", "modules": {"vision": "frozen"}},
                     checkpoint={"strategy": "steps", "steps": 15})
    _run(folder, recipe | {"train": recipe["train"] | {"learning_rate": 1e-3}})
    return folder


@pytest.mark.xdist_group("qwen-full")  # --dist loadgroup (make test-torchvision): one worker, full_run once
def test_full_fine_tuning_learns_with_the_frozen_tower_bit_identical_and_generates_from_final(full_run, models):
    from safetensors.torch import load_file

    from ftune.models.vision_parts import part_of

    run = full_run / "runs" / "r"
    logged = _exact_match(run)
    assert logged["eval_generated"] == ROWS // 5 and logged["eval_exact_match"] >= 0.9, logged
    saved = load_file(str(run / "final" / "model.safetensors"))
    base = load_file(str(models["qwen2_vl"] / "model.safetensors"))
    assert sorted(saved) == sorted(base)  # a whole model in the published layout: from_pretrained reads it
    vision = [n for n in base if part_of(n, "qwen2_vl") == "vision"]
    assert vision and all(saved[n].equal(base[n]) for n in vision)
    assert all(not saved[n].equal(base[n]) for n in base if part_of(n, "qwen2_vl") != "vision")
    assert _generate(run / "final", full_run) == list(COLOURS)


@pytest.mark.xdist_group("qwen-full")
def test_full_fine_tuning_resumes_from_a_checkpoint(full_run, models):
    """Resumed at step 15, the run logs the same loss and gradient norm at step 30 as the run that went through."""
    recipe = _recipe(models["qwen2_vl"], full_run / "data.jsonl",
                     peft={"method": "full", "modules": {"vision": "frozen"}},
                     checkpoint={"strategy": "no", "resume": str(full_run / "runs/r/checkpoints/checkpoint-15")},
                     output={"dir": "runs/resumed", "report_to": ["none"], "loss_curve": False})
    resumed = _run(full_run, recipe | {"train": recipe["train"] | {"learning_rate": 1e-3}}, name="resume.yaml")
    first = {m["step"]: m for m in metrics(full_run / "runs" / "r") if "loss" in m}
    again = {m["step"]: m for m in metrics(resumed) if "loss" in m}
    assert min(again) > 15 and again[STEPS]["loss"] == pytest.approx(first[STEPS]["loss"], rel=1e-5)
    assert again[STEPS]["grad_norm"] == pytest.approx(first[STEPS]["grad_norm"], rel=1e-5)


# ------------------------------------------------------------------ FSDP over both towers
@pytest.mark.distributed
def test_fsdp_wraps_qwen_s_vision_blocks_and_decoder_layers_on_two_processes(models, tmp_path):
    """The tiny Qwen2-VL under FSDP2 on 2 processes (gloo) with gradient checkpointing, 3 steps: the Plan names
    both towers' layer classes, each rank wraps them, and the frozen tower stays out of the adapter."""
    from safetensors.torch import load_file

    from ftune.models.vision_parts import part_of
    from ftune.rundir import RunDir

    recipe = _recipe(models["qwen2_vl"], colour_rows(tmp_path, 16, sides=SIDES),
                     distributed={"strategy": "fsdp", "num_processes": 2}, checkpoint={"strategy": "no"})
    recipe["data"].pop("eval")
    recipe |= {"eval": {"strategy": "no"}, "train": {"max_steps": 3, "learning_rate": 1e-2, "per_device_batch_size": 2,
                                                     "logging_steps": 1, "gradient_checkpointing": True}}
    res = ftune("run", str(write_recipe(tmp_path, recipe)), cwd=tmp_path, timeout=400,
                env={"FTUNE_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1", "FTUNE_RECORD_FACTS": "1"})
    assert res.code == 0, res.text[-4000:]
    run = RunDir(tmp_path / "runs" / "r")
    plan = json.loads(run.plan.read_text())
    wrap = set(plan["launch"]["accelerate_config"]["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"].split(","))
    assert {"Qwen2VLVisionBlock", "Qwen2VLDecoderLayer"} <= wrap, wrap
    for rank in (0, 1):
        facts = json.loads(run.rank_facts(rank).read_text())
        assert facts["world_size"] == 2 and facts["distributed_type"] == "FSDP"
        assert {"FSDPQwen2VLVisionBlock", "FSDPQwen2VLDecoderLayer"} <= set(facts["fsdp_unit_classes"]), facts
    adapter = load_file(str(run.final / "adapter_model.safetensors"))
    assert not [n for n in adapter if part_of(n, "qwen2_vl") == "vision"]
    assert [n for n in adapter if part_of(n, "qwen2_vl") == "projector"]
