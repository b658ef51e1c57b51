"""Bad input: every error names the file, the row or line, the field, and what is available."""

from __future__ import annotations

import json

import pytest

from ftune.errors import FtuneError
from ftune.recipe.schema import Recipe
from ftune.datafiles.check import check_fields
from tests.data_stage import build


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


def recipe(path, source=None, model=None, **data) -> Recipe:
    return Recipe.model_validate({
        "name": "t", "model": {"path": "unused", **(model or {})},
        "data": {"train": [{"path": str(path), **(source or {})}], "shuffle": False, **data},
    })


def build_error(tok, r, tmp_path) -> FtuneError:
    r = r.model_copy(update={"data": r.data.model_copy(update={"cache_dir": str(tmp_path / "cache")})})
    with pytest.raises(FtuneError) as info:
        build(r, tok, log=lambda _: None)
    return info.value


def jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_missing_file(tok, tmp_path):
    err = build_error(tok, recipe(tmp_path / "nope.jsonl"), tmp_path)
    assert "data.train[0].path: no such file:" in err.message and "nope.jsonl" in err.message
    assert "relative to the working directory" in err.hint
    assert check_fields(recipe(tmp_path / "nope.jsonl")) == []  # the compiler's input check reports a missing file


def test_unparsable_jsonl_line_names_the_line(tok, tmp_path):
    path = jsonl(tmp_path / "bad.jsonl", [{"text": "a"}, {"text": "b"}, '{"text": "c",', {"text": "d"}])
    err = build_error(tok, recipe(path), tmp_path)
    assert "line 3 of" in err.message and "not valid JSON" in err.message
    assert err.location.file == str(path) and err.location.line == 3
    ((where, message),) = [(p.path, p.message) for p in check_fields(recipe(path))]
    assert where == "data.train[0].path" and "line 3" in message


def test_missing_field_lists_available_fields_and_spots_sharegpt(tok, tmp_path):
    path = jsonl(tmp_path / "sg.jsonl", [{"conversations": [{"from": "human", "value": "hi"}], "id": 1}])
    err = build_error(tok, recipe(path, {"format": "instruction"}), tmp_path)
    assert "needs field `instruction`" in err.message and "has: conversations, id" in err.message
    assert "format: chat" in err.hint and "role: from, content: value" in err.hint
    assert err.location.line == 1
    problems = check_fields(recipe(path, {"format": "instruction"}))
    assert [p.path for p in problems] == ["data.train[0].fields.instruction", "data.train[0].fields.output"]
    assert "conversations, id" in problems[0].message


def test_sharegpt_under_chat_names_the_whole_mapping_on_the_first_error(tok, tmp_path):
    """One round of errors, not three (conversations, then from, then value)."""
    path = jsonl(tmp_path / "sg.jsonl", [{"conversations": [{"from": "human", "value": "hi"},
                                                            {"from": "gpt", "value": "hello"}]}])
    err = build_error(tok, recipe(path, {"format": "chat"}), tmp_path)
    assert "needs field `messages`" in err.message
    assert err.hint.startswith("this is ShareGPT data: set `format: sharegpt`")
    assert "fields: {messages: conversations, role: from, content: value}" in err.hint
    [(where, _, hint)] = [(p.path, p.message, p.hint) for p in check_fields(recipe(path, {"format": "chat"}))]
    assert where == "data.train[0].fields.messages" and hint == err.hint
    # another chat shape: every field named from the first message's keys
    other = jsonl(tmp_path / "o.jsonl", [{"dialog": [{"role": "user", "text": "hi"}]}])
    err = build_error(tok, recipe(other, {"format": "chat", "fields": {"messages": "dialog"}}), tmp_path)
    assert err.hint == "set `format: chat` and `fields: {messages: dialog, role: role, content: text}`"
    # and the alias itself reads it
    assert recipe(path, {"format": "sharegpt"}).data.train[0].fields.messages == "conversations"


def test_a_defaulted_format_is_named_at_the_source(tok, tmp_path):
    path = jsonl(tmp_path / "a.jsonl", [{"instruction": "say hi", "output": "hi"}])
    err = build_error(tok, recipe(path), tmp_path)
    assert "this source sets no `format`, so it defaulted to text, which needs field `text`" in err.message
    assert "set `format: alpaca` (= `format: instruction`)" in err.hint
    [(where, message, _)] = [(p.path, p.message, p.hint) for p in check_fields(recipe(path))]
    assert where == "data.train[0]" and "defaulted to text" in message


def test_null_field_names_the_row_and_line(tok, tmp_path):
    path = jsonl(tmp_path / "n.jsonl", [{"text": "a"}, "", {"text": None}])
    err = build_error(tok, recipe(path), tmp_path)
    assert "row 2 of" in err.message and "`text` is empty" in err.message
    assert err.location.line == 3  # the blank line is skipped by the loader but counted in the file


def test_unknown_role(tok, tmp_path):
    rows = [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
            {"messages": [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}]}]
    path = jsonl(tmp_path / "c.jsonl", rows)
    err = build_error(tok, recipe(path, {"format": "chat"}), tmp_path)
    assert "row 2 of" in err.message and "unknown role 'bot'" in err.message and "gpt" in err.message
    assert "roles: {bot: assistant}" in err.hint
    assert err.location.line == 2
    ((where, message),) = [(p.path, p.message) for p in check_fields(recipe(path, {"format": "chat"}))]
    assert where == "data.train[0].roles" and "'bot'" in message


def test_message_keys_missing(tok, tmp_path):
    path = jsonl(tmp_path / "k.jsonl", [{"messages": [{"from": "human", "value": "hi"}]}])
    err = build_error(tok, recipe(path, {"format": "chat"}), tmp_path)
    assert "needs keys `role` and `content`, has: from, value" in err.message
    assert err.hint == "set `format: chat` and `fields: {messages: messages, role: from, content: value}`"


def test_empty_dataset(tok, tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("text\n")
    err = build_error(tok, recipe(path), tmp_path)
    assert "has no rows" in err.message and "empty.csv" in err.message


def test_label_not_in_label_names(tok, tmp_path):
    rows = [{"text": "a", "label": "positive"}, {"text": "b", "label": "neutral"}]
    path = jsonl(tmp_path / "l.jsonl", rows)
    r = recipe(path, {"format": "classification"}, {"task": "sequence-classification",
                                                   "labels": ["negative", "positive"]})
    err = build_error(tok, r, tmp_path)
    assert "row 2 of" in err.message and "label 'neutral'" in err.message and "negative, positive" in err.message
    assert err.location.line == 2
    ((where, message),) = [(p.path, p.message) for p in check_fields(r)]
    assert where == "data.train[0].fields.label" and "'neutral'" in message


def test_too_many_dropped_samples_is_an_error(tok, tmp_path):
    rows = [{"instruction": "add 1 and 1", "input": "", "output": ""} for _ in range(3)]
    path = jsonl(tmp_path / "e.jsonl", rows)
    r = recipe(path, {"format": "instruction", "template": "{instruction} = "}, max_seq_length=4)
    err = build_error(tok, r, tmp_path)
    assert "3 of 3 samples (100%) have no trainable token" in err.message
    assert "max_dropped_fraction = 0.1" in err.message and "row 1, line 1" in err.message


def test_template_errors(tok, tmp_path, text_data_file):
    # packing without max_seq_length and similar recipe-level checks are recipe rules (test_recipe_rules.py),
    # run once by `ftune validate`; the data stage doesn't repeat them.
    err = build_error(tok, recipe(text_data_file, {"template": "{nope}", "format": "instruction"}), tmp_path)
    assert "instruction" in err.message  # the text file has no instruction field: reported first
    path = jsonl(tmp_path / "i.jsonl", [{"instruction": "a", "output": "b"}])
    err = build_error(tok, recipe(path, {"template": "{nope}", "format": "instruction"}), tmp_path)
    assert "unknown placeholder(s) nope" in err.message


def test_check_fields_passes_good_sources(text_data_file, instruction_data_file, tmp_path):
    csv = tmp_path / "d.csv"
    csv.write_text("text,label\nhello,positive\n")
    assert check_fields(recipe(text_data_file)) == []
    assert check_fields(recipe(instruction_data_file, {"format": "instruction"})) == []
    assert check_fields(recipe(csv, {"format": "classification"}, {"task": "sequence-classification",
                                                                  "labels": ["negative", "positive"]})) == []


def test_data_errors_survive_worker_processes():
    import pickle

    from ftune.errors import Location
    from ftune.datafiles.errors import DataError

    err = pickle.loads(pickle.dumps(DataError("m", hint="h", location=Location(file="f", line=3))))
    assert (err.message, err.hint, err.location.line) == ("m", "h", 3)


def test_importing_the_data_stage_is_light():
    """`ftune validate --check-paths` imports check_fields: no torch, transformers, datasets or numpy."""
    import subprocess
    import sys

    code = ("import sys, ftune.datastage, ftune.datafiles.check; "
            "print(sorted(m for m in ('torch', 'transformers', 'datasets', 'numpy', 'pyarrow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
