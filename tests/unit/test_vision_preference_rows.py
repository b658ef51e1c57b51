"""Image rows for DPO and GRPO (#40): `vision-preference` and `vision-prompt` rows are read like vision-chat rows
(every bad input located at the row and field), encoded into the columns TRL's trainers take (the prompt rendered
with its image placeholder, `_len` counting the expanded image tokens), and the rules refuse what can't run, located:
an objective that takes no images, a format that doesn't fit the objective, a family TRL can't take images for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftune.datafiles.errors import DataError
from ftune.datafiles.images import ImageProblem, completion_text, parse_prompt
from ftune.errors import RecipeError
from ftune.recipe.schema import DataSource, Recipe
from tests.unit.test_vision_data import _jsonl, _png, processor  # noqa: F401  (the tiny LLaVA processor fixture)


def _src(path: Path, fmt: str):
    from ftune.datafiles.sources import resolve

    if not path.exists():
        path.write_text("{}\n")
    return resolve(DataSource(path=str(path), format=fmt), "data.train[0]")


def _user(*parts) -> list[dict]:
    return [{"role": "user", "content": list(parts)}]


IMG = {"type": "image", "image": "a.png"}
TEXT = {"type": "text", "text": "what colour"}


# ------------------------------------------------------------------------------------------ rows
def test_a_prompt_names_its_images_in_parts_or_in_the_images_column(tmp_path):
    _png(tmp_path / "a.png")
    _png(tmp_path / "b.png")
    src = _src(tmp_path / "d.jsonl", "vision-preference")
    parsed = parse_prompt({"prompt": _user(IMG, TEXT)}, src, tmp_path)
    assert parsed.images == [str(tmp_path / "a.png")] and parsed.fields == ["prompt[0].content[0].image"]
    assert parsed.messages == [{"role": "user", "content": [{"type": "image"}, TEXT]}]
    filled = parse_prompt({"prompt": _user({"type": "image"}, TEXT, {"type": "image"}), "images": ["b.png", "a.png"]},
                          src, tmp_path)
    assert filled.images == [str(tmp_path / "b.png"), str(tmp_path / "a.png")]
    text = parse_prompt({"prompt": "what colour", "images": ["a.png"]}, src, tmp_path)  # images before the text
    assert text.messages == [{"role": "user", "content": [{"type": "image"}, TEXT]}] and text.fields == ["images[0]"]


@pytest.mark.parametrize("row,field,message", [
    ({"prompt": _user({"type": "image"}, TEXT)}, "images", "more `{type: image}` parts without a file"),
    ({"prompt": _user(TEXT), "images": ["a.png"]}, "images", "lists 1 image(s), but the prompt has 0"),
    ({"prompt": _user(TEXT), "images": "a.png"}, "images", "must be a list of image paths"),
    ({"prompt": _user(IMG, TEXT) + [{"role": "assistant", "content": "red"}]}, "prompt[1]", "ends with an assistant"),
    ({"prompt": 3}, "prompt", "must be text or a list of chat messages"),
    ({"prompt": _user({"type": "video", "video": "v.mp4"})}, "prompt[0].content[0].type", "`type: text` or `type: image`"),
])
def test_a_bad_prompt_is_refused_at_its_field(tmp_path, row, field, message):
    with pytest.raises(ImageProblem) as err:
        parse_prompt(row, _src(tmp_path / "d.jsonl", "vision-prompt"), tmp_path)
    assert err.value.field == field and message in err.value.message


def test_a_completion_is_text_or_assistant_messages_of_text(tmp_path):
    src = _src(tmp_path / "d.jsonl", "vision-preference")
    assert completion_text("red", src, "chosen") == "red"
    assert completion_text([{"role": "assistant", "content": [{"type": "text", "text": "red"}]}], src, "chosen") == "red"
    for bad, field in [("", "chosen"), ([{"role": "assistant", "content": [IMG]}], "chosen[0].content"),
                       ([{"role": "user", "content": "red"}], "chosen[0]")]:
        with pytest.raises(ImageProblem) as err:
            completion_text(bad, src, "chosen")
        assert err.value.field == field


# ------------------------------------------------------------------------------------------ encoding
def _encode(processor, path: Path, fmt: str, **data):  # noqa: F811
    import numpy as np

    from ftune.datafiles.images import read_rows
    from ftune.datastage.vision_rows import encode_source

    src = _src(path, fmt)
    rows = read_rows(src)
    recipe = Recipe.model_validate({"name": "v", "model": {"path": "m", "task": "image-text-to-text"},
                                    "data": {"train": [{"path": str(path), "format": fmt}], **data},
                                    "train": {"max_steps": 1}})
    return encode_source(src, rows, np.arange(len(rows)), recipe, processor, processor.chat_template, None)


def test_preference_rows_render_the_prompt_with_its_placeholder_and_count_the_image_tokens(processor, tmp_path):  # noqa: F811
    _png(tmp_path / "a.png")
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": _user(IMG, TEXT), "chosen": "red", "rejected": "blue"},
                                         {"prompt": "no image here", "chosen": "x", "rejected": "y"}])
    enc, _ = _encode(processor, path, "vision-preference")
    first = enc[0]
    assert first["prompt"].count("<image>") == 1 and first["prompt"].endswith("<|im_start|>assistant\n")
    assert first["chosen"].startswith("red") and first["rejected"].startswith("blue")
    assert first["images"] == [str(tmp_path / "a.png")] and enc[1]["images"] == []
    tok = processor.tokenizer
    text_only = len(tok(first["prompt"], add_special_tokens=False)["input_ids"])
    chosen = len(tok(first["chosen"], add_special_tokens=False)["input_ids"])
    assert first["_image_tokens"] == 4 and first["_len"] == text_only - 1 + 4 + chosen  # <image> -> 4 tokens
    assert first["_trainable"] == chosen


def test_prompt_rows_keep_their_messages_for_grpo_with_bare_image_parts(processor, tmp_path):  # noqa: F811
    _png(tmp_path / "a.png")
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": _user(IMG, TEXT), "answer": "red"}])
    enc, _ = _encode(processor, path, "vision-prompt")
    row = enc[0]
    assert json.loads(row["prompt"]) == [{"role": "user", "content": [{"type": "image"}, TEXT]}]
    assert row["answer"] == "red" and row["_row"] == f"data.train[0] row 1 of {path}"
    assert row["images"] == [str(tmp_path / "a.png")] and row["_image_tokens"] == 4


def test_a_bad_row_fails_the_data_stage_at_its_row_and_field(processor, tmp_path):  # noqa: F811
    _png(tmp_path / "a.png")
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": _user(IMG, TEXT), "chosen": "red", "rejected": "blue"},
                                         {"prompt": _user({"type": "image", "image": "gone.png"}, TEXT),
                                          "chosen": "red", "rejected": "blue"}])
    with pytest.raises(DataError) as err:
        _encode(processor, path, "vision-preference")
    assert "row 2 of" in err.value.message and "field prompt[0].content[0].image" in err.value.message
    assert "gone.png does not exist" in err.value.message and err.value.location.line == 2
    with pytest.raises(DataError, match="an image can't be cut"):
        _encode(processor, _jsonl(tmp_path / "e.jsonl", [{"prompt": _user(TEXT, IMG), "chosen": "r", "rejected": "b"}]),
                "vision-preference", max_seq_length=6)


# ------------------------------------------------------------------------------------------ rules
def _load(tmp_path: Path, body: str):
    from ftune.recipe import load_recipe

    f = tmp_path / "r.yaml"
    f.write_text(f"name: t\n{body}")
    return load_recipe(f).recipe


VLM = "model:\n  path: m\n  task: image-text-to-text\n"
RULES = [
    (VLM + "data:\n  train:\n    - {path: d.jsonl, format: vision-preference}\ntrain:\n  objective: kto\n",
     "train.objective", "'kto' does not take image rows: on a vision-language model ftune runs sft, dpo, grpo"),
    (VLM + "data:\n  train:\n    - {path: d.jsonl, format: vision-preference}\ntrain:\n  max_steps: 1\n",
     "data.train[0].format", "vision-preference data needs a preference objective, but train.objective is 'sft'"),
    (VLM + "data:\n  train:\n    - {path: d.jsonl, format: vision-prompt}\ntrain:\n  objective: dpo\n",
     "data.train[0].format", "train.objective 'dpo' reads `format: preference` rows, not vision-prompt"),
    (VLM + "data:\n  train:\n    - {path: d.jsonl, format: preference}\ntrain:\n  objective: dpo\n",
     "data.train[0].format", "this source has format 'preference'"),
    ("model:\n  path: m\ndata:\n  train:\n    - {path: d.jsonl, format: vision-prompt}\ntrain:\n  objective: grpo\n"
     "  rl: {rewards: [{name: exact_match}]}\n", "data.train[0].format", "carries images, but model.task is 'causal-lm'"),
]


@pytest.mark.parametrize("body,where,message", RULES)
def test_image_row_rules_are_located(tmp_path, body, where, message):
    with pytest.raises(RecipeError) as err:
        _load(tmp_path, body)
    found = {p.path: p.message for p in err.value.problems}
    assert where in found and message in found[where], found


@pytest.mark.parametrize("fmt,objective", [("vision-preference", "dpo"), ("vision-prompt", "grpo")])
def test_dpo_and_grpo_on_image_rows_validate(tmp_path, fmt, objective):
    rl = "\n  rl: {rewards: [{name: exact_match}], num_generations: 2}" if objective == "grpo" else ""
    recipe = _load(tmp_path, VLM + f"data:\n  train:\n    - {{path: d.jsonl, format: {fmt}}}\n"
                               f"train:\n  objective: {objective}\n  max_steps: 1\n  per_device_batch_size: 2{rl}\n")
    assert recipe.train.objective == objective


@pytest.mark.parametrize("model_type,refused", [("paligemma", "its processor refuses text without images"),
                                                ("mllama", "through `cross_attention_mask`, which TRL 1.16's DPO"),
                                                ("aya_vision", "ftune has no part layout for aya_vision"),
                                                ("llava", None), ("qwen2_5_vl", None)])
def test_a_family_trl_cannot_take_images_for_is_refused_at_model_path(tmp_path, model_type, refused):
    from ftune.plan.checks.environment import vision_objective

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": model_type}))
    recipe = _load(tmp_path, f"model:\n  path: {tmp_path / 'm'}\n  task: image-text-to-text\ndata:\n  train:\n"
                             "    - {path: d.jsonl, format: vision-preference}\ntrain:\n  objective: dpo\n  max_steps: 1\n")
    problems = vision_objective(recipe)
    if refused is None:
        assert problems == []
    else:
        [p] = problems
        assert p.path == "model.path" and f"'dpo' on {model_type} image rows is not supported" in p.message
        assert refused in p.message
    sft = recipe.model_copy(update={"train": recipe.train.model_copy(update={"objective": "sft"})})
    assert vision_objective(sft) == []  # sft takes every family's images


def test_identical_pairs_with_images_are_refused_before_launch(tmp_path):
    from ftune.datafiles.check import preference_balance

    _png(tmp_path / "a.png")
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": _user(IMG, TEXT), "chosen": "red", "rejected": "red"}] * 3)
    recipe = _load(tmp_path, VLM + f"data:\n  train:\n    - {{path: {path}, format: vision-preference}}\n"
                                   "train:\n  objective: dpo\n  max_steps: 1\n")
    [problem] = preference_balance(recipe)
    assert problem.path == "data.train[0].path" and "3 of 3 rows" in problem.message and problem.severity == "error"
