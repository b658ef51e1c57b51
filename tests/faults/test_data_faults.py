"""Data faults caught in the data stage (before any training), each naming the file and the row or line."""

from __future__ import annotations

import json

import pytest

from ftune.errors import FtuneError
from ftune.recipe.schema import Recipe
from tests.data_stage import build


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


def _error(tok, tmp_path, path, **source) -> FtuneError:
    r = Recipe.model_validate({"name": "t", "model": {"path": "unused"},
                               "data": {"train": [{"path": str(path), **source}], "shuffle": False,
                                        "cache_dir": str(tmp_path / "cache")}})
    with pytest.raises(FtuneError) as info:
        build(r, tok, log=lambda _: None)
    return info.value


def test_invalid_utf8_names_file_line_and_byte(tok, tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    err = _error(tok, tmp_path, path)
    assert "line 2 of" in err.message and "latin1.jsonl" in err.message and "not valid UTF-8" in err.message
    assert "0xe9" in err.message and "iconv" in err.hint
    assert err.location.line == 2 and path.read_bytes().endswith(b"\xe9\"}\n")  # the file is untouched


def test_csv_unterminated_quote_names_the_row(tok, tmp_path):
    path = tmp_path / "broken.csv"
    path.write_text('text\n"one"\n"two\nthree\n')
    err = _error(tok, tmp_path, path)
    assert "row 2 of" in err.message and "broken.csv" in err.message and "starting at line 3" in err.message
    assert "not valid CSV" in err.message and "closing quote" in err.hint


def test_pretokenized_ids_outside_the_vocabulary_fail_before_training(tok, tmp_path):
    path = tmp_path / "ids.jsonl"
    path.write_text(json.dumps({"input_ids": [1, 2, 3]}) + "\n" + json.dumps({"input_ids": [4, len(tok) + 5]}) + "\n")
    err = _error(tok, tmp_path, path, format="pretokenized")
    assert "row 2 of" in err.message and f"token id {len(tok) + 5}" in err.message
    assert f"0..{len(tok) - 1}" in err.message and "re-tokenize" in err.hint


@pytest.mark.parametrize(("row", "expected"), [
    ({"input_ids": [1, 2, 3], "labels": [1, 2]}, "`labels` has 2 values but `input_ids` has 3"),
    ({"input_ids": [1, 2, 3], "attention_mask": [1, 1]}, "`attention_mask` has 2 values but `input_ids` has 3"),
    ({"input_ids": [1, 2, 3], "attention_mask": [1, 2, 1]}, "`attention_mask` holds 2: only 1"),
    ({"input_ids": [1, 2, 3], "labels": [-100, 2, 10 ** 6]}, "label 1000000 in `labels` is neither -100 nor a token"),
    ({"input_ids": [1, -4]}, "token id -4 in `input_ids` is outside the tokenizer's vocabulary"),
])
def test_tokens_rows_that_would_fail_in_training_are_refused_by_row(tok, tmp_path, row, expected):
    """`format: tokens`: each bad row is named by file, row and line before any training."""
    path = tmp_path / "ids.jsonl"
    path.write_text(json.dumps({"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}) + "\n" + json.dumps(row) + "\n")
    err = _error(tok, tmp_path, path, format="tokens")
    assert "row 2 of" in err.message and "ids.jsonl" in err.message and expected in err.message, err.message
    assert err.location.line == 2
