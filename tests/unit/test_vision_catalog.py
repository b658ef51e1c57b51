"""The vision catalog: looked up for `model.task: image-text-to-text` only, mirrors and variants as for text models,
the task named wrong gets a located error, and the lookup and image arithmetic import nothing heavy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ftune.errors import RecipeError
from ftune.models import catalog
from ftune.models.meta import resolve_config
from ftune.recipe.schema import Recipe

REPO = Path(__file__).resolve().parents[2]


def make(path: str) -> Recipe:
    return Recipe.model_validate({"name": "t", "model": {"path": path, "dtype": "bfloat16"}, "peft": {"method": "full"},
                                  "data": {"train": [{"path": "d.jsonl"}], "max_seq_length": 128}})


def test_each_vision_name_names_one_entry():
    assert len(catalog.by_name(vision=True)) == len(catalog.entries(vision=True)) == 7


@pytest.mark.parametrize(
    ("model_id", "entry"),
    [
        ("Qwen/Qwen2.5-VL-7B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct"),
        ("unsloth/Qwen2.5-VL-7B-Instruct-bnb-4bit", "Qwen/Qwen2.5-VL-7B-Instruct"),
        ("Qwen/Qwen3-VL-8B-Instruct", "Qwen/Qwen3-VL-8B-Instruct"),
        ("google/gemma-3-4b-pt", "google/gemma-3-4b-it"),  # the hub's -pt checkpoints are VLMs too
        ("unsloth/gemma-3-12b-it", "google/gemma-3-12b-it"),
        ("HuggingFaceTB/SmolVLM2-2.2B-Instruct", "HuggingFaceTB/SmolVLM2-2.2B-Instruct"),
        ("llava-hf/llava-1.5-7b-hf", "llava-hf/llava-1.5-7b-hf"),
        ("google/paligemma2-3b-pt-224", "google/paligemma2-3b-pt-224"),
    ],
)
def test_vision_ids_resolve_in_the_vision_catalog(model_id, entry):
    assert catalog.lookup(model_id, vision=True) == (entry, catalog.entries(vision=True)[entry])


def test_the_same_name_is_the_text_decoder_for_a_text_task():
    assert catalog.lookup("google/gemma-3-4b-it") == ("google/gemma-3-4b-pt", catalog.entries()["google/gemma-3-4b-pt"])
    assert catalog.lookup("google/paligemma2-3b-pt-448", vision=True) is None  # another resolution: not matched


def test_a_vlm_under_the_text_task_is_told_to_set_the_task():
    with pytest.raises(RecipeError) as err:
        resolve_config(make("Qwen/Qwen2.5-VL-7B-Instruct"))
    (p,) = err.value.problems
    assert p.path == "model.task"
    assert p.message == ("'Qwen/Qwen2.5-VL-7B-Instruct' is a vision-language model in the catalog "
                         "(Qwen/Qwen2.5-VL-7B-Instruct), but model.task is 'causal-lm'")
    assert p.hint == "set model.task: image-text-to-text"


PROBE = """
import json, sys
from ftune.models import catalog
from ftune.estimate.vision_cost import image_cost
found = catalog.lookup("unsloth/Qwen2.5-VL-7B-Instruct", vision=True)
cost = image_cost(json.loads(found[1].read_text()), 1024 * 28 * 28)
heavy = sorted(m for m in ("torch", "transformers", "peft", "accelerate", "datasets") if m in sys.modules)
print(json.dumps([found[0], cost.tokens, heavy]))
"""


def test_vision_catalog_and_image_arithmetic_import_nothing_heavy():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["Qwen/Qwen2.5-VL-7B-Instruct", 1024, []]


def test_a_text_model_under_the_vision_task_is_located():
    r = Recipe.model_validate({"name": "t", "model": {"path": "meta-llama/Llama-3.1-8B", "task": "image-text-to-text"},
                               "data": {"train": [{"path": "d.jsonl", "format": "vision-chat"}]}})
    with pytest.raises(RecipeError) as err:
        resolve_config(r)
    (p,) = err.value.problems
    assert (p.path, p.message) == ("model.task", "'meta-llama/Llama-3.1-8B' is a text-only model in the catalog "
                                                 "(meta-llama/Llama-3.1-8B), but model.task is 'image-text-to-text'")
    assert p.hint.startswith("name a vision-language model (docs/vision-plan.md lists the catalog's)")


VALIDATE = """
import sys
from ftune.cli.main import main
code = main(["validate", sys.argv[1]])
heavy = sorted(m for m in ("torch", "transformers", "peft", "accelerate", "datasets") if m in sys.modules)
print("HEAVY=" + ",".join(heavy))
sys.exit(code)
"""


def test_validating_a_vision_recipe_imports_nothing_heavy(tmp_path):
    (tmp_path / "r.yaml").write_text(
        "name: t\nmodel:\n  path: Qwen/Qwen2.5-VL-7B-Instruct\n  task: image-text-to-text\n"
        "peft:\n  method: lora\n  modules: {vision: lora, projector: full, language: lora}\n"
        "data:\n  train: [{path: d.jsonl, format: vision-chat}]\n  max_seq_length: 2048\n"
        "  images: {max_pixels: 1003520}\ntrain:\n  max_steps: 2\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", VALIDATE, str(tmp_path / "r.yaml")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "HEAVY="
