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
from tests.vision_data import COLOURS, colour_rows

pytestmark = pytest.mark.slow
ROWS = 150


def _data(folder: Path, blank: bool) -> Path:
    """ROWS rows of the colour task (tests/vision_data.py), or their blanked control."""
    return colour_rows(folder, ROWS, blank)


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
    raw = _recipe(vlm_dir, _data(folder, blank))
    if not blank:  # the colour run trains with the tiled loss (the same loss; the image rows' logits in slices)
        raw["train"]["tiled_loss"] = True
    recipe = write_recipe(folder, raw)
    res = ftune("run", str(recipe), cwd=folder, env={"FTUNE_CACHE": str(folder / "cache")})
    assert res.code == 0, res.text
    assert ("tiled loss: the output head and loss in slices: auto" in res.text) == (not blank)
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

    from ftune.models.vision_parts import part_of

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


# ------------------------------------------------------------------ after training: generate --file, chat, merge
def _squares(folder: Path) -> dict[str, Path]:
    from PIL import Image

    (folder / "pics").mkdir(exist_ok=True)
    for name, rgb in COLOURS.items():
        Image.new("RGB", (28, 28), rgb).save(folder / "pics" / f"{name}.png")
    return {name: folder / "pics" / f"{name}.png" for name in COLOURS}


def _image_row(*paths: str, text: str = "what colour") -> dict:
    return {"messages": [{"role": "user", "content": [*({"type": "image", "image": p} for p in paths),
                                                      {"type": "text", "text": text}]}]}


@pytest.fixture(scope="module")
def prompt_rows(tmp_path_factory) -> Path:
    """rows.jsonl with image parts (paths relative to the file): red, green, a text-only row, blue."""
    folder = tmp_path_factory.mktemp("prompts")
    _squares(folder)
    rows = [_image_row("pics/red.png"), _image_row("pics/green.png"), {"prompt": "what colour"},
            _image_row("pics/blue.png")]
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _generate_file(target: Path, rows: Path, capsys) -> list[str]:
    from ftune.cli.main import main

    capsys.readouterr()
    code = main(["generate", str(target), "--file", str(rows), "--batch-size", "3", "--max-new-tokens", "6",
                 "--format", "json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return [r["completion"] for r in json.loads(out.out)["results"]]


def test_generate_file_rows_with_image_parts_batched_and_bad_rows_located(colour_run, prompt_rows, capsys,
                                                                          monkeypatch):
    """--file rows carry images as the data did (relative to the file); batches of 3 mix rows with and without an
    image; a bad image part is a usage error at the row and field, before any model is loaded."""
    run = colour_run / "runs" / "r"
    answers = _generate_file(run, prompt_rows, capsys)
    assert [answers[0], answers[1], answers[3]] == ["red", "green", "blue"], answers

    from ftune.cli.main import main

    bad = prompt_rows.parent / "bad.jsonl"
    cases = {
        "gone": (_image_row("pics/gone.png"), "field messages[0].content[0].image: image", "does not exist"),
        "text": (_image_row("rows.jsonl"), "field messages[0].content[0].image:", "is not an image PIL can read"),
        "two": (_image_row("pics/red.png", "pics/blue.png"), "field messages[0].content[1].image: 2 images",
                "at most 1 per sample"),
        "part": ({"messages": [{"role": "user", "content": [{"type": "video", "video": "x.mp4"}]}]},
                 "field messages[0].content[0].type:", "needs `type: text` or `type: image`"),
    }
    for name, (row, field, message) in cases.items():
        bad.write_text(json.dumps({"prompt": "fine"}) + "\n\n" + json.dumps(row) + "\n")
        capsys.readouterr()
        code = main(["generate", str(run), "--file", str(bad)])
        err = capsys.readouterr().err
        assert code == 2 and f"{bad}:3" in err and f"row 2 of {bad}, {field}" in err and message in err, (name, err)
        assert "Traceback" not in err


def test_generate_names_a_vision_model_folder_it_was_not_given_the_run_of(vlm_dir, capsys):
    from ftune.cli.main import main

    capsys.readouterr()
    assert main(["generate", str(vlm_dir), "--prompt", "hi"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert f"{vlm_dir}/config.json: error: {vlm_dir} holds a llava model that AutoModelForCausalLM can't load" in err
    assert "model.task: image-text-to-text" in err and "internal error" not in err


def test_chat_with_image_attached_through_stdin(colour_run, prompt_rows, capsys, monkeypatch):
    """/image attaches a picture to the next message (said so), a bad path or a second image for a one-image model
    is a clear message and the chat goes on, and /save writes a vision-chat row."""
    import io
    import sys

    from ftune.cli.main import main

    monkeypatch.chdir(prompt_rows.parent)
    saved = prompt_rows.parent / "chats.jsonl"
    script = ("/image pics/gone.png\n/image rows.jsonl\n/image pics/red.png\nwhat colour\n/image pics/green.png\n"
              "/reset\n/image pics/blue.png\nwhat colour\n/save chats.jsonl\n/quit\n")
    monkeypatch.setattr(sys, "stdin", io.StringIO(script))
    capsys.readouterr()
    code = main(["chat", str(colour_run / "runs" / "r"), "--max-new-tokens", "6"])
    out = capsys.readouterr().out
    assert code == 0, out
    text = " ".join(out.split())  # rich wraps long lines
    assert "(chat prompts, images with /image PATH)" in text
    assert "/image pics/gone.png: image" in text and "does not exist" in text
    assert "/image rows.jsonl:" in text and "is not an image PIL can read" in text
    assert text.count("image attached:") == 2 and "red.png (28x28 as the model sees it)" in text
    assert "at most 1 image per conversation, and this one has 1" in text
    answers = [line.removeprefix("model> ") for line in out.splitlines() if line.startswith("model> ")]
    assert answers == ["red", "blue"], out
    [row] = [json.loads(line) for line in saved.read_text().splitlines()]
    blue = str((prompt_rows.parent / "pics" / "blue.png").resolve())
    assert row == {"messages": [*_image_row(blue)["messages"], {"role": "assistant", "content": "blue"}]}
    assert "a `format: vision-chat` row" in text


@pytest.fixture(scope="module")
def merged_vlm(colour_run) -> tuple[Path, dict]:
    """`ftune merge` of the colour run, in this process (the plan in the run dir names its data cache)."""
    import contextlib
    import io

    from ftune.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["merge", str(colour_run / "runs" / "r"), "--dtype", "float32", "--format", "json"])
    assert code == 0, err.getvalue()
    return colour_run / "runs" / "r" / "merged", json.loads(out.getvalue())


def test_merge_folds_into_the_whole_vlm_checked_on_image_inputs_and_generates_the_same(
        merged_vlm, colour_run, vlm_dir, prompt_rows, capsys):
    from safetensors.torch import load_file

    from ftune.models.vision_parts import part_of

    merged, result = merged_vlm
    assert result["action"] == "merged" and result["max_diff"] <= result["tolerance"]
    # the check ran on the data file's first rows (the eval split is drawn from it) with their images, read directly
    # as for a text run: pixel inputs through the vision tower and projector
    assert result["images"] == 4 and result["sample_source"] == "4 train rows with 4 images (pixel_values)"
    assert {"processor_config.json", "chat_template.jinja", "tokenizer.json"} <= set(result["files"])
    weights, base = load_file(str(merged / "model.safetensors")), load_file(str(vlm_dir / "model.safetensors"))
    assert sorted(weights) == sorted(base)  # the whole model: vision tower and projector included, no adapter name
    adapter = load_file(str(colour_run / "runs" / "r" / "final" / "adapter_model.safetensors"))
    adapter = {n.removeprefix("base_model.model.").removeprefix("model."): t for n, t in adapter.items()}
    for name in base:
        part = part_of(name, "llava")
        if part == "vision":
            assert weights[name].equal(base[name]), name  # frozen: the base's, bit for bit
        elif part == "projector":  # trained whole: the adapter's copy
            assert weights[name].equal(adapter[name]) and not weights[name].equal(base[name]), name
    assert json.loads((merged / "ftune.json").read_text())["task"] == "image-text-to-text"
    answers = _generate_file(merged, prompt_rows, capsys)
    assert [answers[0], answers[1], answers[3]] == ["red", "green", "blue"], answers


def test_merge_check_sees_a_projector_that_did_not_reach_the_merged_weights(colour_run, tmp_path, monkeypatch,
                                                                              capsys):
    """The projector only acts on image features: a check on text alone would pass this broken merge."""
    import torch

    from ftune.cli.main import main
    from ftune.infer import merge

    fold = merge._fold

    def broken(unmerged):
        model = fold(unmerged)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "multi_modal_projector" in name:
                    p.add_(0.5)
        return model

    monkeypatch.setattr(merge, "_fold", broken)
    capsys.readouterr()
    code = main(["merge", str(colour_run / "runs" / "r"), "--out", str(tmp_path / "m"), "--dtype", "float32"])
    err = capsys.readouterr().err
    assert code == 3 and "merge check failed" in err and "on 4 train rows with 4 images (pixel_values)" in err, err
    assert list(tmp_path.iterdir()) == []


def test_merge_check_draws_an_image_when_the_runs_data_is_gone(merged_vlm, colour_run, monkeypatch):
    """Without the run's rows (or images) the check still goes through the vision tower: a drawn image."""
    import torch
    from transformers import AutoModelForImageTextToText

    from ftune.datafiles import sample
    from ftune.infer import merge
    from ftune.infer.source import resolve
    from ftune.infer.image_prompts import load_vision
    from ftune import datastage as data

    target = resolve(str(colour_run / "runs" / "r"))
    proc = load_vision(target).processor

    def gone(src, n):
        raise FileNotFoundError(src.path)

    monkeypatch.setattr(sample, "peek", gone)  # the data file is gone when the check reads its first rows
    [sample], source, images = merge._sample_inputs(target.plan, proc.tokenizer, proc)
    assert images == 1 and source == ("a drawn image with a fixed question (pixel_values; the run's data or its "
                                      "images are unavailable)")
    model = AutoModelForImageTextToText.from_pretrained(str(merged_vlm[0])).eval()
    [drawn] = merge._logits(model, [sample])
    [blank] = merge._logits(model, [{**sample, "pixel_values": torch.zeros_like(sample["pixel_values"])}])
    assert not torch.allclose(drawn, blank)  # the drawn image reaches the logits
