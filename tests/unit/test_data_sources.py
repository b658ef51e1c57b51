"""Sources: every local format loads the same rows; mixing by weight and limit; eval split; seeded order."""

from __future__ import annotations

import json

import pytest

from ftune.recipe.schema import Recipe
from tests.data_stage import build

TEXTS = [f"the cat sat on mat number {i}" for i in range(40)]


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


def make(tok, tmp_path, train, **data):
    r = Recipe.model_validate({
        "name": "t", "model": {"path": "unused"},
        "data": {"train": train, "cache_dir": str(tmp_path / "cache"), **data},
    })
    return build(r, tok, log=lambda _: None)


def decoded(tok, ds) -> list[str]:
    return [tok.decode(ids[:-1]) for ids in ds["input_ids"]]  # without the appended eos


@pytest.fixture
def files(tmp_path):
    import datasets

    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    (tmp_path / "a.json").write_text(json.dumps([{"text": t} for t in TEXTS]))
    (tmp_path / "a.csv").write_text("text\n" + "".join(t + "\n" for t in TEXTS))
    (tmp_path / "a.txt").write_text("".join(t + "\n" for t in TEXTS))
    ds = datasets.Dataset.from_dict({"text": TEXTS})
    ds.to_parquet(str(tmp_path / "a.parquet"))
    ds.save_to_disk(str(tmp_path / "disk"))
    datasets.DatasetDict({"train": ds, "test": ds.select(range(3))}).save_to_disk(str(tmp_path / "dict"))
    return tmp_path


@pytest.mark.parametrize("name", ["a.jsonl", "a.json", "a.csv", "a.txt", "a.parquet", "disk", "dict"])
def test_every_local_format_loads_the_same_rows(tok, files, name):
    b = make(tok, files, [{"path": str(files / name)}], shuffle=False)
    assert decoded(tok, b.train) == TEXTS


def test_split_of_a_save_to_disk_dict(tok, files):
    b = make(tok, files, [{"path": str(files / "dict"), "split": "test"}], shuffle=False)
    assert decoded(tok, b.train) == TEXTS[:3]
    with pytest.raises(Exception, match="no split 'dev'.*") as info:
        make(tok, files, [{"path": str(files / "dict"), "split": "dev"}])
    assert "train, test" in info.value.hint


def test_relative_paths_are_relative_to_the_working_directory(tok, files, monkeypatch):
    monkeypatch.chdir(files)
    b = make(tok, files, [{"path": "a.csv"}], shuffle=False)
    assert decoded(tok, b.train) == TEXTS


def test_shuffle_is_seeded(tok, files):
    one = make(tok, files, [{"path": str(files / "a.jsonl")}])
    two = make(tok, files, [{"path": str(files / "a.jsonl")}])
    assert decoded(tok, one.train) == decoded(tok, two.train) != TEXTS
    assert sorted(decoded(tok, one.train)) == sorted(TEXTS)


def test_limit_and_weights_mix_sources(tok, files, tmp_path):
    other = tmp_path / "b.jsonl"
    other.write_text("".join(json.dumps({"text": f"a dog ran {i}"}) + "\n" for i in range(10)))
    b = make(tok, files, [{"path": str(files / "a.jsonl"), "limit": 30}, {"path": str(other)}], shuffle=False)
    texts = decoded(tok, b.train)
    assert texts == TEXTS[:30] + [f"a dog ran {i}" for i in range(10)]
    assert [(s.rows, s.used) for s in b.report.sources] == [(30, 30), (10, 10)]
    # weight 1:3 over 40 samples: 10 from the first source, 30 (each row three times) from the second
    b = make(tok, files, [{"path": str(files / "a.jsonl"), "limit": 30, "weight": 1},
                          {"path": str(other), "weight": 3}], shuffle=False)
    texts = decoded(tok, b.train)
    assert len(texts) == 40
    assert sum(t.startswith("a dog") for t in texts) == 30
    assert all(texts.count(f"a dog ran {i}") == 3 for i in range(10))
    assert len(set(texts[:10])) == 10 and set(texts[:10]) <= set(TEXTS[:30])
    assert [s.used for s in b.report.sources] == [10, 30]  # the realised mix, reported
    assert "data: mix data.train[0] 10 (25.0%) · data.train[1] 30 (75.0%)" in b.report.lines()


def test_interleave_realises_the_weights_as_probabilities():
    """0.8/0.2 over 10k samples: 0.8 +- 0.02 from the first source (first_exhausted stops at the second's end when
    it is the one that runs out), seeded; all_exhausted keeps drawing until every source was seen whole."""
    import datasets

    from ftune.datastage.pipeline import mix

    a = datasets.Dataset.from_dict({"x": list(range(20_000))})
    b = datasets.Dataset.from_dict({"x": list(range(100_000, 120_000))})
    mixed, taken = mix([a.select(range(8_000)), b.select(range(2_000))], [0.8, 0.2], seed=3, how="interleave")
    assert abs(taken[0] / sum(taken) - 0.8) <= 0.02 and sum(taken) == len(mixed) >= 9_000
    assert sum(1 for v in mixed["x"] if v < 100_000) == taken[0]
    again, _ = mix([a.select(range(8_000)), b.select(range(2_000))], [0.8, 0.2], seed=3, how="interleave")
    assert again["x"] == mixed["x"]
    full, taken = mix([a.select(range(100)), b.select(range(10))], [1, 1], seed=0, how="interleave",
                      stopping="all_exhausted")
    assert taken[0] >= 100 and taken[1] >= 100  # the short source repeats until the long one is done


def test_interleave_through_the_recipe(tok, files, tmp_path):
    other = tmp_path / "b.jsonl"
    other.write_text("".join(json.dumps({"text": f"a dog ran {i}"}) + "\n" for i in range(40)))
    b = make(tok, files, [{"path": str(files / "a.jsonl"), "weight": 3}, {"path": str(other), "weight": 1}],
             mix="interleave", mix_stopping="all_exhausted")
    texts = decoded(tok, b.train)
    assert set(TEXTS) <= set(texts) and {f"a dog ran {i}" for i in range(40)} <= set(texts)
    assert [s.used for s in b.report.sources] == [sum(t in TEXTS for t in texts), sum(t.startswith("a dog") for t in texts)]


def test_eval_split_holds_out_a_fraction_without_overlap(tok, files):
    b = make(tok, files, [{"path": str(files / "a.jsonl")}], eval={"split": 0.25})
    train, held = decoded(tok, b.train), decoded(tok, b.eval)
    assert (len(train), len(held)) == (30, 10)
    assert not set(train) & set(held) and set(train) | set(held) == set(TEXTS)
    assert (b.report.train_samples, b.report.eval_samples) == (30, 10)


def test_eval_from_files(tok, files):
    b = make(tok, files, [{"path": str(files / "a.jsonl")}], shuffle=False,
             eval=[{"path": str(files / "a.csv"), "limit": 5}])
    assert decoded(tok, b.eval) == TEXTS[:5]
    assert [s.where for s in b.report.sources] == ["data.train[0]", "data.eval[0]"]


def test_packed_eval_has_the_same_token_semantics(tok, files):
    b = make(tok, files, [{"path": str(files / "a.jsonl")}], eval={"split": 0.25}, packing=True,
             max_seq_length=64)
    assert set(b.eval.column_names) == {"input_ids", "labels", "position_ids"}
    assert b.report.eval_packed_rows == len(b.eval) < 10
    segments = sum(row.count(0) for row in b.eval["position_ids"])
    assert segments == 10  # every held-out sample, whole, in its own segment


def test_num_proc_gives_the_same_rows_and_errors_cross_processes(tok, files, tmp_path):
    one = make(tok, files, [{"path": str(files / "a.jsonl")}])
    two = make(tok, tmp_path / "other", [{"path": str(files / "a.jsonl")}], num_proc=2)
    assert not two.report.cache_hit  # a fresh cache: really built by two processes
    assert two.train["input_ids"] == one.train["input_ids"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS) + json.dumps({"text": None}) + "\n")
    with pytest.raises(Exception, match=r"row 41 of .*bad.jsonl: field `text` is empty") as info:
        make(tok, tmp_path / "third", [{"path": str(bad)}], num_proc=2)
    assert info.value.location.line == 41


def test_a_hub_name_that_cannot_be_reached_is_a_clear_error(tok, tmp_path):
    with pytest.raises(Exception, match=r"could not load the hub dataset 'nobody/nothing'") as info:
        make(tok, tmp_path, [{"path": "nobody/nothing"}])
    assert "HF_DATASETS_OFFLINE" in info.value.hint


def test_a_streamed_bad_line_halfway_names_the_file_and_line(tok, tmp_path):
    """Streaming reads JSONL itself: a line that is not JSON, past the first batch, stops with its file and line."""
    from ftune.recipe.schema import DataSource
    from ftune.datafiles.errors import DataError
    from ftune.datafiles.formats import Context
    from ftune.datafiles.sources import Source
    from ftune.datastage.stream import BATCH, _samples

    good = tmp_path / "a.jsonl"
    good.write_text("".join(json.dumps({"text": f"the cat sat {i}"}) + "\n" for i in range(30)))
    bad = tmp_path / "b.jsonl"
    lines = [json.dumps({"text": f"a dog ran {i}"}) for i in range(BATCH + 50)]
    lines[BATCH + 10] = '{"text": "cut off'
    bad.write_text("\n".join(lines) + "\n")
    src = Source(DataSource(path=str(tmp_path / "*.jsonl")), "data.train[0]", str(tmp_path / "*.jsonl"), "json")
    rows = _samples([str(good), str(bad)], src, Context(tok, 32, "all", ""), seed=0, pack_to=None)
    with pytest.raises(DataError) as err:
        for _ in rows:
            pass
    assert f"line {BATCH + 11} of {bad}" in err.value.message and "is not valid JSON" in err.value.message
    assert (err.value.location.file, err.value.location.line) == (str(bad), BATCH + 11)


def test_streamed_eval_reads_its_files_in_order_up_to_the_limit_at_every_evaluation(tok, tmp_path):
    """`data.streaming` with `data.eval` files: the eval set is a stream too, in file order (never shuffled), bounded
    by each file's `limit` rows, and read from the start each time the trainer iterates it."""
    for name, word in (("a", "cat"), ("b", "dog")):
        (tmp_path / f"eval-{name}.jsonl").write_text(
            "".join(json.dumps({"text": f"the {word} sat {i}"}) + "\n" for i in range(30)))
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"text": f"a bird sang {i}"}) + "\n" for i in range(9)))
    r = Recipe.model_validate({"name": "t", "model": {"path": "unused"}, "train": {"max_steps": 3}, "data": {
        "train": [{"path": str(tmp_path / "train.jsonl")}], "streaming": True, "max_seq_length": 32,
        "eval": [{"path": str(tmp_path / "eval-*.jsonl"), "limit": 4}], "cache_dir": str(tmp_path / "cache")}})
    bundle = build(r, tok, log=lambda _: None)
    texts = [tok.decode(row["input_ids"], skip_special_tokens=True) for row in bundle.eval]
    assert texts == [f"the {w} sat {i}" for w in ("cat", "dog") for i in range(4)]
    assert [tok.decode(row["input_ids"], skip_special_tokens=True) for row in bundle.eval] == texts  # again, whole
    assert bundle.report.stream_eval_files == 2 and "eval streamed from 2 file(s)" in bundle.report.lines()[0]
    assert not (tmp_path / "cache").exists()  # nothing cached
