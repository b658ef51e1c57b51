"""Every source is checked alike (issue #37): each file of a glob goes through the single-file checks (the message
names the file), a glob's files must share their columns, a glob never matches an ftune run dir's files (and the
plan says so), a streamed row's error is located like a cached one's, and weights whose sum overflows are refused."""

from __future__ import annotations

import json

import pytest

from ftune.datafiles.check import check_fields
from ftune.errors import RecipeError
from ftune.recipe import load_recipe


def _recipe(tmp_path, path: str, **data):
    text = {"name": "g", "model": {"path": "m"}, "data": {"train": [{"path": path}], **data},
            "train": {"max_steps": 1}}
    (tmp_path / "r.yaml").write_text(json.dumps(text))
    return load_recipe(tmp_path / "r.yaml").recipe


def _jsonl(path, *rows: dict):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_each_file_of_a_glob_gets_the_single_file_checks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _jsonl(tmp_path / "d/a.jsonl", {"text": "fine"})
    _jsonl(tmp_path / "d/b.jsonl", {"text": "fine"}, {"text": {"nested": 1}})  # trained as '{"nested":1}' before
    (problem,) = check_fields(_recipe(tmp_path, "d/*.jsonl"))
    assert problem.path == "data.train[0].fields.text"
    assert problem.message == f"row 2 of {tmp_path / 'd/b.jsonl'}: `text` holds an object ({{'nested': 1}}), not text"


def test_a_glob_whose_files_have_different_columns_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _jsonl(tmp_path / "d/a.jsonl", {"text": "x"})
    _jsonl(tmp_path / "d/b.jsonl", {"text": "y", "source": "web"})
    (problem,) = check_fields(_recipe(tmp_path, "d/*.jsonl"))
    assert problem.path == "data.train[0].path" and problem.severity == "error"
    assert problem.message == (f"d/*.jsonl matches files with different columns: {tmp_path / 'd/b.jsonl'} has text, "
                               f"source, but {tmp_path / 'd/a.jsonl'} has text")


def test_a_glob_skips_ftune_run_dirs_and_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _jsonl(tmp_path / "work/data/a.jsonl", {"text": "x"})
    _jsonl(tmp_path / "work/runs/old/completions.jsonl", {"prompt": "p", "completion": "c"})
    (tmp_path / "work/runs/old/ftune_run.json").write_text("{}")
    recipe = _recipe(tmp_path, "work/*/*/*.jsonl")
    spec = recipe.data.train[0]
    assert spec.files() == [] and spec.run_dir_matches() == [str(tmp_path / "work/runs/old/completions.jsonl")]
    (warning,) = check_fields(recipe)
    assert warning.severity == "warning" and "inside ftune run dirs" in warning.message
    # a pattern rooted inside a run dir reads it: the user named that folder
    assert _recipe(tmp_path, "work/runs/old/*.jsonl").data.train[0].files()[0].endswith("completions.jsonl")


def test_weights_whose_sum_overflows_are_refused(tmp_path):
    with pytest.raises(RecipeError) as err:
        load_recipe_text(tmp_path, {"train": [{"path": "a.jsonl", "weight": 1e308}, {"path": "b.jsonl", "weight": 1e308}],
                                    "mix": "interleave"})
    assert [p.path for p in err.value.problems] == ["data.train[0].weight"]
    assert "sum past the largest float" in err.value.problems[0].message


def load_recipe_text(tmp_path, data: dict):
    (tmp_path / "r.yaml").write_text(json.dumps({"name": "w", "model": {"path": "m"}, "data": data,
                                                 "train": {"max_steps": 1}}))
    return load_recipe(tmp_path / "r.yaml")


def test_a_streamed_token_row_out_of_the_vocabulary_is_located(tiny_tokenizer_dir, tmp_path):
    """Streaming's rows are named by file and line: the encoder's error said `int() argument must be ... not
    'Location'` (an internal error) where the cached pipeline names the row."""
    from transformers import AutoTokenizer

    from ftune.datafiles.errors import DataError
    from ftune.datafiles.formats import Context
    from ftune.datafiles.sources import Source
    from ftune.datastage.stream import _samples
    from ftune.recipe.schema import DataSource

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    file = tmp_path / "t.jsonl"
    _jsonl(file, {"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}, {"input_ids": [6, 10 ** 6]})
    spec = DataSource(path=str(file), format="tokens")
    src = Source(spec, "data.train[0]", str(file), "json")
    with pytest.raises(DataError) as err:
        list(_samples([str(file)], src, Context(tok, 32, "all", ""), seed=0, pack_to=None))
    assert err.value.message.startswith(f"data.train[0]: line 3 of {file}: token id 1000000 in `input_ids` is "
                                        "outside the tokenizer's vocabulary")
    assert (err.value.location.file, err.value.location.line) == (str(file), 3)


def test_a_glob_the_loader_refuses_is_a_data_error_not_the_pattern_opened_as_a_file(tmp_path):
    """What `ftune data` and the worker hit when `datasets` can't load a glob: the diagnosis read each file (it
    opened the pattern itself: FileNotFoundError, an internal error)."""
    from ftune.datafiles.errors import DataError
    from ftune.datafiles.sources import load, resolve
    from ftune.recipe.schema import DataSource

    _jsonl(tmp_path / "d/a.jsonl", {"text": "x"})
    (tmp_path / "d/b.jsonl").write_text('{"text": "y"}\n{"text": "cut\n')
    with pytest.raises(DataError) as err:
        load(resolve(DataSource(path=str(tmp_path / "d/*.jsonl")), "data.train[0]"), tmp_path / "scratch")
    assert err.value.message.startswith(f"data.train[0]: line 2 of {tmp_path / 'd/b.jsonl'} is not valid JSON: ")
    assert (err.value.location.file, err.value.location.line) == (str(tmp_path / "d/b.jsonl"), 2)


def test_a_non_integer_token_id_is_named_at_its_own_row(tiny_tokenizer_dir, tmp_path):
    """Arrow types every row of the file as floats when one holds 2.5: the error named the batch's first row
    (row 2, shuffled), whose ids were fine. Whole floats read as ids; 2.5 is named at row 15."""
    from transformers import AutoTokenizer

    from ftune.datafiles.errors import DataError
    from ftune.recipe.schema import Recipe
    from tests.data_stage import build

    rows = [{"input_ids": [1, 2, 3]} for _ in range(20)]
    rows[14] = {"input_ids": [1, 2.5, 3]}
    _jsonl(tmp_path / "t.jsonl", *rows)
    recipe = Recipe.model_validate({"name": "t", "model": {"path": "unused"}, "data": {
        "train": [{"path": str(tmp_path / "t.jsonl"), "format": "tokens"}], "cache_dir": str(tmp_path / "cache")}})
    with pytest.raises(DataError) as err:
        build(recipe, AutoTokenizer.from_pretrained(tiny_tokenizer_dir), log=lambda _: None)
    assert err.value.message == (f"data.train[0]: row 15 of {tmp_path / 't.jsonl'}: field `input_ids` holds 2.5, "
                                 "not a token id (a whole number)")
    assert err.value.location.line == 15
