"""The cache: hit on an identical rerun, a miss (with the reason) on anything that changes the tokens."""

from __future__ import annotations

import contextlib
import json

import pytest

from ftune.recipe.schema import Recipe
from tests.data_stage import build
from ftune.plan.batching import cache_root
from ftune.datastage.cache import Cache, make_key


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


def chat_file(path):
    rows = [{"messages": [{"role": "user", "content": f"q {i}"}, {"role": "assistant", "content": f"the cat {i}"}]}
            for i in range(20)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def recipe(path, cache, **data) -> Recipe:
    return Recipe.model_validate({
        "name": "t", "model": {"path": "unused"},
        "data": {"train": [{"path": str(path), "format": "chat"}], "cache_dir": str(cache), **data},
    })


def quiet(r, tok):
    lines = []
    return build(r, tok, log=lines.append), lines


def test_rerun_hits_and_reports_the_same_numbers(tok, tmp_path):
    r = recipe(chat_file(tmp_path / "c.jsonl"), tmp_path / "cache", max_seq_length=32, packing=True)
    first, lines1 = quiet(r, tok)
    second, lines2 = quiet(r, tok)
    assert not first.report.cache_hit and first.report.cache_reason == "no cache entry for these data files yet"
    assert second.report.cache_hit and second.report.cache_path == first.report.cache_path
    assert any("cache miss (no cache entry" in x for x in lines1) and any("cache hit" in x for x in lines2)
    assert second.report.fill == first.report.fill and second.report.trainable_tokens == first.report.trainable_tokens
    assert second.train["input_ids"] == first.train["input_ids"]
    entries = list((tmp_path / "cache").iterdir())
    assert len(entries) == 1 and not entries[0].name.startswith(".tmp")  # written atomically, scratch removed
    manifest = json.loads((entries[0] / "manifest.json").read_text())
    assert set(manifest["parts"]) == {"format_version", "data_section", "task", "data_files", "tokenizer",
                                      "chat_template"}


def test_a_changed_tokenizer_never_reuses_the_cache(tok, tmp_path, tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    from ftune.tiny import train_tokenizer

    r = recipe(chat_file(tmp_path / "c.jsonl"), tmp_path / "cache")
    before, _ = quiet(r, tok)
    other = train_tokenizer(["q 1 the cat", "assistant user"] * 50, tmp_path / "tok2", vocab_size=300)
    after, _ = quiet(r, other)
    assert not after.report.cache_hit and after.report.cache_reason == "the tokenizer changed"
    assert after.train["input_ids"] != before.train["input_ids"]
    assert max(max(x) for x in after.train["input_ids"]) < len(other)
    # The same tokenizer with an extra token is a different tokenizer too.
    grown = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    grown.add_tokens(["<|new|>"])
    assert quiet(r, grown)[0].report.cache_reason == "the tokenizer changed"
    assert quiet(r, tok)[0].report.cache_hit  # and the original is still cached


def test_a_changed_chat_template_never_reuses_the_cache(tok, tmp_path, tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    r = recipe(chat_file(tmp_path / "c.jsonl"), tmp_path / "cache")
    quiet(r, tok)
    templated = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    templated.chat_template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    b, _ = quiet(r, templated)
    assert not b.report.cache_hit and b.report.cache_reason == "the chat template changed"
    assert templated.decode(b.train[0]["input_ids"]).startswith("[user] q")
    own = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    r2 = recipe(r.data.train[0].path, tmp_path / "cache", chat_template=own)
    b2, _ = quiet(r2, tok)
    assert not b2.report.cache_hit
    assert b2.report.cache_reason == "the chat template changed; data.chat_template changed"


def test_changed_data_file_and_recipe_are_misses_with_reasons(tok, tmp_path):
    path = chat_file(tmp_path / "c.jsonl")
    quiet(recipe(path, tmp_path / "cache"), tok)
    with path.open("a") as fh:
        fh.write(json.dumps({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}))
    b, _ = quiet(recipe(path, tmp_path / "cache"), tok)
    assert b.report.cache_reason == f"data file {path} changed" and b.report.rows == 21
    b, _ = quiet(recipe(path, tmp_path / "cache", max_seq_length=40), tok)
    assert b.report.cache_reason == "data.max_seq_length changed"
    r = recipe(path, tmp_path / "cache", max_seq_length=40)
    r = r.model_copy(update={"train": r.train.model_copy(update={"seed": 7})})
    assert quiet(r, tok)[0].report.cache_reason == "model.task/labels or train.seed changed"


def test_main_process_goes_first_and_other_ranks_read_the_cache(tok, tmp_path):
    r = recipe(chat_file(tmp_path / "c.jsonl"), tmp_path / "cache")
    entered = []

    @contextlib.contextmanager
    def main_process_first():
        entered.append(True)
        yield

    main = build(r, tok, main_process_first=main_process_first, log=lambda _: None)
    other = build(r, tok, main_process_first=main_process_first, log=lambda _: None)
    assert entered == [True, True]
    assert (main.report.cache_hit, other.report.cache_hit) == (False, True)


def test_failed_preprocessing_leaves_no_entry(tok, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "robot", "content": "x"}]}) + "\n")
    with pytest.raises(Exception, match="unknown role"):
        build(recipe(path, tmp_path / "cache"), tok, log=lambda _: None)
    assert list((tmp_path / "cache").iterdir()) == []


def test_cache_root_and_lost_race(tmp_path, monkeypatch):
    monkeypatch.setenv("FTUNE_CACHE", str(tmp_path / "env"))
    assert cache_root(None) == tmp_path / "env"
    assert cache_root(str(tmp_path / "x")) == tmp_path / "x"
    monkeypatch.delenv("FTUNE_CACHE")
    assert cache_root(None).parts[-3:] == (".cache", "ftune", "data")
    cache = Cache(tmp_path / "c")
    key = make_key(data_section={}, extra={}, files={"f": "1"}, tokenizer="t", template="x")
    a, b = cache.scratch(), cache.scratch()
    (a / "mine").write_text("a")
    (b / "mine").write_text("b")
    assert cache.commit(a, key) == cache.entry(key)
    assert cache.commit(b, key) == cache.entry(key)  # another rank won: its entry is kept, ours discarded
    assert (cache.entry(key) / "mine").read_text() == "a"
    assert [p.name for p in (tmp_path / "c").iterdir()] == [key.digest]


def test_a_leftover_without_manifest_is_replaced_by_the_next_commit(tmp_path):
    """An entry folder without manifest.json was never published (entries appear only by the rename): the next
    commit clears it instead of failing (`ftune.outputs.publish_entry`, shared with the GGUF conversion cache)."""
    cache = Cache(tmp_path / "c")
    key = make_key(data_section={}, extra={}, files={"f": "1"}, tokenizer="t", template="x")
    cache.entry(key).mkdir(parents=True)
    (cache.entry(key) / "half").write_text("left by hand")
    scratch = cache.scratch()
    (scratch / "mine").write_text("a")
    assert cache.commit(scratch, key) == cache.entry(key)
    assert sorted(p.name for p in cache.entry(key).iterdir()) == ["manifest.json", "mine"]
    assert [p.name for p in (tmp_path / "c").iterdir()] == [key.digest]
