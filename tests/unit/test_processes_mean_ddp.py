"""`distributed.num_processes=2` on a recipe that writes no strategy means DDP (a note in the plan says so); a
recipe that writes `strategy: none` keeps it, and the contradiction is refused with the override to add."""

from __future__ import annotations

import pytest
import yaml

from ftune.plan.compile import compile_plan
from ftune.recipe import load_recipe
from tests.unit.test_cluster_env import _recipe


def _load(tmp_path, distributed: dict | None, overrides=()):
    recipe = {"name": "u", "model": {"path": "org/m"}, "data": {"train": [{"path": "d.jsonl"}]},
              "train": {"max_steps": 1}}
    if distributed is not None:
        recipe["distributed"] = distributed
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return load_recipe(path, overrides)


@pytest.mark.parametrize("override", ["distributed.num_processes=2", "distributed.num_machines=2"])
def test_processes_without_a_strategy_mean_ddp(tmp_path, override):
    extra = ["distributed.main_process_ip=10.0.0.1"] if "machines" in override else []
    assert _load(tmp_path, None, [override, *extra]).recipe.distributed.strategy == "ddp"
    assert _load(tmp_path, {"num_processes": 1}, [override, *extra]).recipe.distributed.strategy == "ddp"


def test_one_process_stays_none(tmp_path):
    assert _load(tmp_path, None).recipe.distributed.strategy == "none"
    assert _load(tmp_path, None, ["distributed.num_processes=auto"]).recipe.distributed.strategy == "none"


def test_a_written_strategy_none_is_refused_with_the_override_to_add(tmp_path, capsys):
    from ftune.cli.main import main

    _load(tmp_path, {"strategy": "none", "num_processes": 2})  # the job's shape: validate and the compiler check it
    assert main(["validate", str(tmp_path / "r.yaml")]) == 1
    text = capsys.readouterr().out
    assert "num_processes is 2 but distributed.strategy is 'none'" in text
    assert "add the override `distributed.strategy=ddp`" in text


def test_the_plan_notes_the_inferred_strategy(tmp_path):
    plan = compile_plan(_recipe(tmp_path, {"num_processes": 2}), environ={})
    assert plan.recipe.distributed.strategy == "ddp" and plan.num_processes == 2
    assert any("distributed.strategy is not set" in note for note in plan.notes)
    written = compile_plan(_recipe(tmp_path, {"strategy": "ddp", "num_processes": 2}), environ={})
    assert not any("distributed.strategy is not set" in note for note in written.notes)
