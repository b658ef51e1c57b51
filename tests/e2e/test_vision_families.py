"""The colour task (tests/vision_data.py) learned through `ftune run` by a tiny model of each vision-language family
whose processor works without torchvision in transformers 5.23 (#40): LLaVA-NeXT (tiles + image_newline), Gemma 3
(`<start_of_image>` expanded with soft tokens; `num_crops` and `token_type_ids`), PaliGemma (BOS put after the
image tokens, a newline appended), Idefics3 (the placeholder rewritten) and Mllama (the image outside the sequence,
read by cross-attention layers through `cross_attention_mask`). Held-out exact match from chance (1/3)
to >= 0.9 as for the LLaVA test, the vision tower frozen (nothing of it in the adapter), the projector trained.
Gemma 3 runs in `make test`; the others, one run each of about 13 to 20 CPU s, are `extended`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e._util import ftune, metrics, write_recipe
from tests.vision_data import COLOURS, colour_rows

pytestmark = pytest.mark.slow
ROWS = 150

FAMILIES = {  # model_type -> (builder in ftune.tiny / ftune.tiny_vision, its keyword arguments)
    "gemma3": ("ftune.tiny_vision", "build_tiny_gemma3", {}),
    "llava_next": ("ftune.tiny_vision", "build_tiny_llava_next", {}),
    "paligemma": ("ftune.tiny_vision", "build_tiny_paligemma", {}),
    "idefics3": ("ftune.tiny", "build_tiny_idefics3", {"init_range": 0.2}),
    "mllama": ("ftune.tiny_vision", "build_tiny_mllama", {}),
}
IN_MAKE_TEST = {"gemma3"}


def _build(family: str, folder: Path, tokenizer_dir: Path) -> Path:
    import importlib

    from transformers import AutoTokenizer

    module, name, kwargs = FAMILIES[family]
    getattr(importlib.import_module(module), name)(folder, AutoTokenizer.from_pretrained(tokenizer_dir), **kwargs)
    return folder


def _recipe(model: Path, data: Path) -> dict:
    return {"schema_version": 1, "name": "vlm",
            "model": {"path": str(model), "task": "image-text-to-text", "dtype": "float32"},
            "data": {"train": [{"path": str(data), "format": "vision-chat"}], "eval": {"split": 0.2},
                     "max_seq_length": 64},
            "peft": {"method": "lora", "r": 8, "alpha": 16, "target_modules": "all-linear"},
            "train": {"max_steps": 30, "learning_rate": 1e-2, "per_device_batch_size": 8},
            "eval": {"strategy": "no", "generate": {"max_new_tokens": 6, "metrics": ["exact_match"]}},
            "checkpoint": {"strategy": "no"},
            "output": {"dir": "runs/r", "report_to": ["none"], "loss_curve": False}}


@pytest.mark.parametrize("family", [f if f in IN_MAKE_TEST else pytest.param(f, marks=pytest.mark.extended)
                                    for f in FAMILIES])
def test_each_family_learns_the_colour_in_the_image(family, tmp_path, tiny_tokenizer_dir):
    from safetensors.torch import load_file

    from ftune.models.vision_parts import part_of

    model = _build(family, tmp_path / family, tiny_tokenizer_dir)
    recipe = write_recipe(tmp_path, _recipe(model, colour_rows(tmp_path, ROWS)))
    res = ftune("run", str(recipe), cwd=tmp_path, env={"FTUNE_CACHE": str(tmp_path / "cache")})
    assert res.code == 0, res.text
    run = tmp_path / "runs" / "r"
    logged = next(m for m in metrics(run) if "eval_exact_match" in m)
    assert logged["eval_generated"] == ROWS // 5 and logged["eval_exact_match"] >= 0.9, logged
    first = json.loads((run / "predictions.jsonl").read_text().splitlines()[0])
    assert first["completion"] == first["reference"] in COLOURS
    parts: dict[str, list[str]] = {"vision": [], "projector": [], "language": []}
    for name in load_file(str(run / "final" / "adapter_model.safetensors")):
        parts[part_of(name, family)].append(name)
    assert parts["vision"] == [] and parts["projector"] and parts["language"], {k: len(v) for k, v in parts.items()}
    assert (run / "final" / "processor_config.json").is_file()
