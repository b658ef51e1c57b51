"""Full fine-tuning of a vision-language model (#40), on the tiny LLaVA of tests/e2e/test_vision.py: with
`peft.method: full` and `peft.modules: {vision: frozen}` the projector and the language model train whole, the
vision tower stays the base's bit for bit, final/ is a whole model in the published layout that `ftune eval` and
`ftune generate` read (no merge), and a checkpoint resumes (transformers 5.23 saves checkpoints in LLaVA's published
layout but resumes them in the model's own names: ftune writes them in the model's names)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e._util import ftune, metrics, write_recipe
from tests.vision_data import COLOURS, colour_rows

pytestmark = pytest.mark.slow
ROWS, STEPS = 150, 30


def _recipe(vlm_dir: Path, data: Path, **sections) -> dict:
    return {"schema_version": 1, "name": "vlm-full",
            "model": {"path": str(vlm_dir), "task": "image-text-to-text", "dtype": "float32"},
            "data": {"train": [{"path": str(data), "format": "vision-chat"}], "eval": {"split": 0.2},
                     "max_seq_length": 64},
            "peft": {"method": "full", "modules": {"vision": "frozen"}},
            "train": {"max_steps": STEPS, "learning_rate": 1e-3, "per_device_batch_size": 8},
            "eval": {"strategy": "no", "generate": {"max_new_tokens": 6, "metrics": ["exact_match"]}},
            "checkpoint": {"strategy": "steps", "steps": 15},
            "output": {"dir": "runs/r", "report_to": ["none"], "loss_curve": False}} | sections


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, vlm_dir) -> Path:
    folder = tmp_path_factory.mktemp("full")
    recipe = write_recipe(folder, _recipe(vlm_dir, colour_rows(folder, ROWS)))
    res = ftune("run", str(recipe), cwd=folder, env={"FTUNE_CACHE": str(folder / "cache")})
    assert res.code == 0, res.text
    return folder


def test_full_fine_tuning_learns_from_final_with_the_frozen_tower_bit_identical(full_run, vlm_dir, capsys,
                                                                               monkeypatch):
    from safetensors.torch import load_file

    from ftune.cli.main import main
    from ftune.models.vision_parts import part_of

    final = full_run / "runs" / "r" / "final"
    saved, base = load_file(str(final / "model.safetensors")), load_file(str(vlm_dir / "model.safetensors"))
    assert sorted(saved) == sorted(base)  # a whole model in LLaVA's published layout: from_pretrained reads it
    vision = [n for n in base if part_of(n, "llava") == "vision"]
    assert vision and all(saved[n].equal(base[n]) for n in vision)  # frozen: the base's bits
    trained = [n for n in base if part_of(n, "llava") != "vision"]
    assert all(not saved[n].equal(base[n]) for n in trained)  # projector and language model: every tensor moved
    params = json.loads((full_run / "runs" / "r" / "params.json").read_text())
    assert params["trainable"] == sum(base[n].numel() for n in trained) < params["total"]

    monkeypatch.chdir(full_run)
    capsys.readouterr()
    assert main(["eval", "recipe.yaml", "--generate", "--format", "json"]) == 0  # held-out rows, from final/
    out = json.loads(capsys.readouterr().out)["metrics"]
    assert out["eval_generated"] == ROWS // 5 and out["eval_exact_match"] >= 0.9, out


@pytest.mark.extended
def test_generate_on_final_names_the_colour_without_a_merge(full_run, capsys, tmp_path):
    from PIL import Image

    from ftune.cli.main import main

    answers = {}
    for name, rgb in COLOURS.items():
        Image.new("RGB", (28, 28), rgb).save(tmp_path / f"{name}.png")
        capsys.readouterr()
        assert main(["generate", str(full_run / "runs" / "r" / "final"), "--prompt", "what colour", "--image",
                     str(tmp_path / f"{name}.png"), "--max-new-tokens", "6", "--format", "json"]) == 0
        answers[name] = json.loads(capsys.readouterr().out)["results"][0]["completion"]
    assert answers == {name: name for name in COLOURS}


@pytest.mark.extended
def test_a_resume_from_a_checkpoint_continues_the_same_run(full_run, vlm_dir):
    """Resumed at step 15, the run logs the same last-window loss and gradient norm at step 30 as the run that went
    through (a checkpoint that loaded nothing would restart from the base and differ)."""
    checkpoint = full_run / "runs" / "r" / "checkpoints" / "checkpoint-15"
    recipe = write_recipe(full_run, _recipe(vlm_dir, full_run / "data.jsonl", checkpoint={
        "strategy": "no", "resume": str(checkpoint)}) | {"output": {"dir": "runs/resumed", "report_to": ["none"],
                                                                    "loss_curve": False}}, name="resume.yaml")
    res = ftune("run", str(recipe), cwd=full_run, env={"FTUNE_CACHE": str(full_run / "cache")})
    assert res.code == 0, res.text
    first = {m["step"]: m for m in metrics(full_run / "runs" / "r") if "loss" in m}
    again = {m["step"]: m for m in metrics(full_run / "runs" / "resumed") if "loss" in m}
    assert min(again) > 15 and again[STEPS]["loss"] == pytest.approx(first[STEPS]["loss"], rel=1e-5)
    assert again[STEPS]["grad_norm"] == pytest.approx(first[STEPS]["grad_norm"], rel=1e-5)
