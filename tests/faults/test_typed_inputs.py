"""Inputs are typed where they enter: a list or an object where text is expected is refused with the row and the
hint that fits (token ids -> `format: pretokenized`, image parts -> `format: vision-chat` for a VLM), in the data
stage, in `validate --check-paths`, and in `generate --file`; never stringified into "[1, 2, 3]"."""

from __future__ import annotations

import json

import pytest

from ftune.cli.main import main
from ftune.errors import FtuneError
from ftune.recipe.schema import Recipe
from ftune.typed import not_text
from ftune.datafiles.check import check_fields
from tests.data_stage import build

IMAGE_CHAT = [{"role": "user", "content": [{"type": "image", "image": "cat.png"}, {"type": "text", "text": "what?"}]},
              {"role": "assistant", "content": [{"type": "text", "text": "a cat"}]}]
CASES = [  # format, rows, field named, what it holds, hint
    ("text", [{"text": [1, 2, 3]}, {"text": [4, 5]}], "`text`", "a list of token ids", "format: pretokenized"),
    ("instruction", [{"instruction": "q", "output": ["a", "b"]}], "`output`", "a list (['a', 'b'])",
     "must be a string"),
    ("chat", [{"messages": IMAGE_CHAT}], "`content`", "image (or other media) parts", "`format: vision-chat`"),
]


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


def _recipe(tmp_path, fmt, rows) -> Recipe:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return Recipe.model_validate({"name": "t", "model": {"path": "unused"},
                                  "data": {"train": [{"path": str(path), "format": fmt}], "shuffle": False,
                                           "cache_dir": str(tmp_path / "cache")}})


@pytest.mark.parametrize(("fmt", "rows", "field", "holds", "hint"), CASES, ids=[c[0] for c in CASES])
def test_the_data_stage_refuses_non_text_located_at_the_row(tok, tmp_path, fmt, rows, field, holds, hint):
    with pytest.raises(FtuneError) as info:
        build(_recipe(tmp_path, fmt, rows), tok, log=lambda _: None)
    err = info.value
    assert "row 1 of" in err.message and field in err.message and f"holds {holds}, not text" in err.message
    assert hint in err.hint and err.location.line == 1, err.render()


@pytest.mark.parametrize(("fmt", "rows", "field", "holds", "hint"), CASES, ids=[c[0] for c in CASES])
def test_validate_check_paths_refuses_them_before_launch(tmp_path, fmt, rows, field, holds, hint):
    [(path, message, found_hint)] = [(p.path, p.message, p.hint) for p in check_fields(_recipe(tmp_path, fmt, rows))]
    assert path.startswith("data.train[0].fields.") and f"holds {holds}, not text" in message and hint in found_hint


def test_generate_file_refuses_a_list_prompt_at_its_line(tmp_path, capsys, tiny_model_dir):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "fine"}) + "\n" + json.dumps({"prompt": [101, 2023]}) + "\n"
                       + json.dumps({"messages": IMAGE_CHAT}) + "\n")
    assert main(["generate", str(tmp_path), "--file", str(prompts)]) == 2
    err = capsys.readouterr().err
    assert f"{prompts}:2:1: error: `prompt` holds a list of token ids, not text" in err and "pretokenized" in err
    # image parts are read by a vision-language run (tests/e2e/test_vision.py); a text model's rows refuse them
    prompts.write_text(json.dumps({"prompt": "fine"}) + "\n" + json.dumps({"messages": IMAGE_CHAT}) + "\n")
    assert main(["generate", str(tiny_model_dir), "--file", str(prompts)]) == 2
    err = capsys.readouterr().err
    assert f"{prompts}:2:1: error: message 1's `content` holds image (or other media) parts" in err
    assert "image parts need a vision-language run" in err


def test_numbers_stay_text_and_text_parts_get_their_own_hint():
    assert not_text("a") is None and not_text(42) is None and not_text(None) is None
    assert not_text([{"type": "text", "text": "x"}]) == ("a list of text parts", "join the parts' `text` into one string")
    assert not_text({"a": 1})[0].startswith("an object")
