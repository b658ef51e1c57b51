"""The Qwen2-VL / Qwen2.5-VL path on a machine without torchvision (#26): transformers 5.23 builds their processor
only with a video processor, which needs torchvision even for images, so `ftune run` refuses the recipe before
launch, at `model.path`, with the install hint, instead of failing in the worker. The branch is forced both ways
(torchvision found or not), so the test means the same on a machine that has it."""

from __future__ import annotations

import importlib.util
import json

import pytest
import yaml

from tests.unit.test_vision_plan import TINY


@pytest.fixture
def recipe_file(tmp_path):
    model = tmp_path / "qwen"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY))
    (model / "preprocessor_config.json").write_text("{}")  # an image processor is there: only torchvision lacks
    (model / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")  # and a template
    (tmp_path / "d.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "x"},
                                                               {"role": "assistant", "content": "y"}]}) + "\n")
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({
        "name": "q", "model": {"path": str(model), "task": "image-text-to-text"},
        "data": {"train": [{"path": str(tmp_path / "d.jsonl"), "format": "vision-chat"}]}, "train": {"max_steps": 1},
        "output": {"dir": str(tmp_path / "run")}}, sort_keys=False))
    return path


def _find_spec(found: bool):
    real = importlib.util.find_spec
    return lambda name, *a: (real("json") if found else None) if name == "torchvision" else real(name, *a)


def test_qwen2_5_vl_without_torchvision_is_refused_at_model_path_with_the_install_hint(recipe_file, monkeypatch,
                                                                                        capsys):
    from ftune.cli.main import main

    monkeypatch.setattr(importlib.util, "find_spec", _find_spec(False))
    assert main(["run", str(recipe_file), "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert "recipe.yaml:3:3: error: model.path: " in err, err  # located at the key, the only problem
    assert "1 error" in err
    assert "qwen2_5_vl's processor needs torchvision in transformers 5.23" in err
    assert "pip install torchvision" in err and "download.pytorch.org/whl/cpu" in err
    assert "Traceback" not in err


def test_with_torchvision_found_the_check_lets_it_through(recipe_file, monkeypatch):
    from ftune.plan.checks.environment import torchvision
    from ftune.recipe import load_recipe

    recipe = load_recipe(str(recipe_file)).recipe
    monkeypatch.setattr(importlib.util, "find_spec", _find_spec(True))
    assert torchvision(recipe) == []
    monkeypatch.setattr(importlib.util, "find_spec", _find_spec(False))
    assert [p.path for p in torchvision(recipe)] == ["model.path"]
    llava = recipe.model_copy(update={"model": recipe.model.model_copy(update={"path": str(recipe_file.parent)})})
    (recipe_file.parent / "config.json").write_text('{"model_type": "llava"}')
    assert torchvision(llava) == []  # LLaVA's processor has no video processor


def test_the_tiny_qwen2_vl_of_the_gpu_suite_takes_its_image_processor_s_inputs(tiny_tokenizer_dir):
    """What `ftune.tiny_vision.build_tiny_qwen2_vl` saves, less the processor (which needs torchvision): the config
    and the PIL image processor agree (a 28x28 image: a 2x2 patch grid, merged into one `<|image_pad|>`), the model
    reads them with M-RoPE's `mm_token_type_ids`, and `part_of` splits it as Qwen's layout says."""
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from ftune.models.vision_parts import part_of
    from ftune.tiny_vision import qwen2_vl_parts

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    config, images = qwen2_vl_parts(tok)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config)
    px = images(images=[[Image.new("RGB", (28, 28), (220, 30, 30))]], return_tensors="pt")
    assert px["image_grid_thw"].tolist() == [[1, 2, 2]]
    ids = tok("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>what colour<|im_end|>",
              return_tensors="pt")["input_ids"]
    assert int((ids == config.image_token_id).sum()) == 1
    out = model(input_ids=ids, labels=ids, mm_token_type_ids=(ids == config.image_token_id).int(), **px)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    assert model.model.visual.merger.mlp[0].weight.grad.abs().sum() > 0  # the image reached the loss
    parts = {part_of(n, "qwen2_vl") for n, _ in model.named_parameters()}
    assert parts == {"vision", "projector", "language"}
