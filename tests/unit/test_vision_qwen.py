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
