"""A hub dataset the Hugging Face cache holds is checked before launch, at the files tier (#44): the answer column an
RL reward reads, and the fields its format needs, from the files `datasets` downloaded into the cache
(`datasets--org--name/snapshots/<commit>/`), as a local file's first rows are. Not in the cache: nothing to read
without a download, so it passes to the data stage (which says the same after launch)."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from ftune import hub
from ftune.cli.main import main
from ftune.datafiles.check import check_fields
from ftune.recipe import load_recipe

COMMIT = "d" * 40


def _cached(repo_id: str, files: dict[str, list[dict]]) -> None:
    repo = hub.cache_root() / f"datasets--{repo_id.replace('/', '--')}"
    shutil.rmtree(repo, ignore_errors=True)
    for name, rows in files.items():
        file = repo / "snapshots" / COMMIT / name
        file.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".parquet"):
            pq.write_table(pa.Table.from_pylist(rows), file)
        else:
            file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)


def _recipe(tmp_path, source: dict, rewards=({"name": "numeric"},)) -> str:
    raw = {"name": "hubrl", "model": {"path": "m"}, "data": {"train": [{"format": "prompt", **source}],
                                                            "max_seq_length": 64},
           "train": {"objective": "grpo", "max_steps": 2, "per_device_batch_size": 4,
                     "rl": {"rewards": list(rewards), "num_generations": 4}},
           "output": {"dir": str(tmp_path / "run")}}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


def _found(tmp_path, source: dict, **kw) -> list[tuple[str, str]]:
    return [(p.path, p.message) for p in check_fields(load_recipe(_recipe(tmp_path, source, **kw)).recipe)]


def test_the_answer_column_of_a_cached_hub_dataset_is_checked_before_launch(tmp_path, capsys):
    rows = [{"prompt": "2+2=", "solution": "4"}, {"prompt": "3+3=", "solution": "6"}]
    _cached("acme/math", {"data/train-00000-of-00001.parquet": rows, "data/test-00000-of-00001.parquet": rows,
                          "README.md": []})
    [(where, message)] = _found(tmp_path, {"path": "acme/math", "type": "hub"})
    assert where == "data.train[0].fields.answer"
    assert message == ("reward numeric compares completions with each row's `answer`, but the first rows of "
                       "acme/math have: prompt, solution")
    # the same through `validate --check-paths` (the files tier), located at the source's line; a name without
    # `type: hub` is the same hub dataset
    path = _recipe(tmp_path, {"path": "acme/math"})
    assert main(["validate", path, "--check-paths", "--format", "json"]) == 1
    errors = json.loads(capsys.readouterr().out)["files"][0]["errors"]
    [error] = [e for e in errors if e["path"].startswith("data.")]  # (model `m` is not here either)
    assert (error["path"], error["message"]) == (where, message)
    # mapped, or rewards that read no answer: nothing to refuse
    assert _found(tmp_path, {"path": "acme/math", "type": "hub", "fields": {"answer": "solution"}}) == []
    assert _found(tmp_path, {"path": "acme/math", "type": "hub"}, rewards=[{"name": "regex", "pattern": "4"}]) == []


def test_the_split_chooses_the_file_and_a_missing_prompt_field_is_refused(tmp_path):
    _cached("acme/split", {"train.jsonl": [{"question": "q", "answer": "1"}],
                           "test.jsonl": [{"prompt": "p", "answer": "1"}]})
    [(where, message)] = _found(tmp_path, {"path": "acme/split", "type": "hub"})
    assert where == "data.train[0].fields.prompt" and "have: question, answer" in message
    assert _found(tmp_path, {"path": "acme/split", "type": "hub", "split": "test"}) == []


def test_a_hub_dataset_not_in_the_cache_is_left_to_the_data_stage(tmp_path):
    assert hub.dataset_snapshot("acme/absent") is None
    assert _found(tmp_path, {"path": "acme/absent", "type": "hub"}) == []
