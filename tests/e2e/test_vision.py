"""Vision-language fine-tuning through the real CLI (#26): a tiny LLaVA built from a config, with its processor
made offline, learns the colour of the square drawn in each image (held-out exact match from chance to >= 0.9
through `ftune run` and `ftune eval --generate`); the same run on blank images stays at chance (the image reaches
the model); the frozen vision tower is not in the adapter, the projector trained whole, the language model by
LoRA."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e._util import ftune, metrics, write_recipe

pytestmark = pytest.mark.slow
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220)}
ROWS = 150


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory, tiny_tokenizer_dir) -> Path:
    from transformers import AutoTokenizer

    from ftune.tiny import build_tiny_llava

    folder = tmp_path_factory.mktemp("tiny-llava")
    build_tiny_llava(folder, AutoTokenizer.from_pretrained(tiny_tokenizer_dir))
    return folder


def _data(folder: Path, blank: bool) -> Path:
    """ROWS rows, the colours in turn (chance is 1/3 whatever the model guesses): a 28x28 image of the colour (or
    white), "what colour", the colour's name."""
    from PIL import Image

    (folder / "img").mkdir()
    rows = []
    for i in range(ROWS):
        name = sorted(COLOURS)[i % 3]
        Image.new("RGB", (28, 28), (255, 255, 255) if blank else COLOURS[name]).save(folder / "img" / f"{i}.png")
        rows.append({"messages": [
            {"role": "user", "content": [{"type": "image", "image": f"img/{i}.png"},
                                         {"type": "text", "text": "what colour"}]},
            {"role": "assistant", "content": name}]})
    path = folder / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _recipe(vlm_dir: Path, data: Path) -> dict:
    return {"schema_version": 1, "name": "vlm",
            "model": {"path": str(vlm_dir), "task": "image-text-to-text", "dtype": "float32"},
            "data": {"train": [{"path": str(data), "format": "vision-chat"}], "eval": {"split": 0.2},
                     "max_seq_length": 64},
            "peft": {"method": "lora", "r": 8, "alpha": 16, "target_modules": "all-linear"},
            "train": {"max_steps": 30, "learning_rate": 1e-2, "per_device_batch_size": 8},
            "eval": {"strategy": "no", "generate": {"max_new_tokens": 6, "metrics": ["exact_match"]}},
            "checkpoint": {"strategy": "no"},
            "output": {"dir": "runs/r", "report_to": ["none"], "loss_curve": False}}


def _run(tmp_path_factory, vlm_dir: Path, blank: bool) -> Path:
    folder = tmp_path_factory.mktemp("blank" if blank else "colour")
    recipe = write_recipe(folder, _recipe(vlm_dir, _data(folder, blank)))
    res = ftune("run", str(recipe), cwd=folder, env={"FTUNE_CACHE": str(folder / "cache")})
    assert res.code == 0, res.text
    return folder


@pytest.fixture(scope="module")
def colour_run(tmp_path_factory, vlm_dir) -> Path:
    return _run(tmp_path_factory, vlm_dir, blank=False)


@pytest.fixture(scope="module")
def blank_run(tmp_path_factory, vlm_dir) -> Path:
    return _run(tmp_path_factory, vlm_dir, blank=True)


def _generated(folder: Path) -> dict:
    return next(m for m in metrics(folder / "runs" / "r") if "eval_exact_match" in m)


def test_a_tiny_vlm_learns_the_colour_in_the_image_and_eval_generate_agrees(colour_run, capsys, monkeypatch):
    logged = _generated(colour_run)
    assert logged["eval_generated"] == ROWS // 5 and logged["eval_exact_match"] >= 0.9, logged
    monkeypatch.chdir(colour_run)
    from ftune.cli.main import main

    capsys.readouterr()
    assert main(["eval", "recipe.yaml", "--generate", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)["metrics"]
    assert out["eval_exact_match"] >= 0.9 and out["eval_generated"] == ROWS // 5, out
    first = json.loads((colour_run / "runs" / "r" / "predictions.jsonl").read_text().splitlines()[0])
    assert first["prompt"].count("<image>") == 4  # a 28x28 image at patch 14: 4 image tokens
    assert first["completion"] == first["reference"] in COLOURS


def test_blank_images_stay_at_chance(blank_run):
    """Same rows, same model, images blanked: the answer can't be read from the text, so ~1/3."""
    assert _generated(blank_run)["eval_exact_match"] <= 0.5


def test_frozen_vision_tower_is_untouched_projector_trained_whole_language_by_lora(colour_run, vlm_dir):
    from safetensors.torch import load_file

    from ftune.models.vision import part_of

    adapter = load_file(str(colour_run / "runs" / "r" / "final" / "adapter_model.safetensors"))
    base = load_file(str(vlm_dir / "model.safetensors"))
    parts: dict[str, list[str]] = {"vision": [], "projector": [], "language": []}
    for name in adapter:
        parts[part_of(name, "llava")].append(name)
    assert parts["vision"] == []  # frozen: nothing of it saved, the base's tensors are what the model uses
    assert parts["language"] and all(".lora_A." in n or ".lora_B." in n for n in parts["language"])
    assert all(adapter[n].abs().sum() > 0 for n in parts["language"] if ".lora_B." in n)  # B starts at 0
    # the checkpoint keeps LLaVA's own key layout (`multi_modal_projector.x`, no `model.` prefix)
    projector = {n.removeprefix("base_model.model.").removeprefix("model."): adapter[n] for n in parts["projector"]}
    assert sorted(projector) == sorted(n for n in base if part_of(n, "llava") == "projector") != []
    assert all(not projector[n].equal(base[n]) for n in projector)  # trained whole: every tensor moved
    assert (colour_run / "runs" / "r" / "final" / "processor_config.json").is_file()  # the processor travels with final/, so eval and generate read images the same way


def test_generate_with_an_image_names_its_colour(colour_run, capsys, tmp_path):
    from PIL import Image

    from ftune.cli.main import main

    answers = {}
    for name, rgb in COLOURS.items():
        path = tmp_path / f"{name}.png"
        Image.new("RGB", (28, 28), rgb).save(path)
        capsys.readouterr()
        code = main(["generate", str(colour_run / "runs" / "r"), "--prompt", "what colour", "--image", str(path),
                     "--max-new-tokens", "6", "--format", "json"])
        out = capsys.readouterr()
        assert code == 0, out.err
        answers[name] = json.loads(out.out)["results"][0]["completion"]
    assert answers == {name: name for name in COLOURS}
    code = main(["generate", str(colour_run / "runs" / "r"), "--prompt", "x", "--image", str(tmp_path / "no.png")])
    assert code == 2 and "no.png does not exist" in capsys.readouterr().err
