"""The plan compiler: every decision before launch, and environment problems located in the recipe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ftune.errors import RecipeError
from ftune.plan.compile import compile_plan
from ftune.rundir import COMPLETE_MARKER, RUN_MARKER, RunDir
from ftune.recipe import load_recipe
from ftune.tiny import CONFIG


def _recipe(tmp_path: Path, **top) -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(CONFIG))  # a tiny Llama, no weights
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "hello"}\n')
    recipe = {
        "name": "unit",
        "model": {"path": str(model)},
        "data": {"train": [{"path": str(data)}]},
        "train": {"max_steps": 10, "per_device_batch_size": 4, "gradient_accumulation_steps": 2},
        "output": {"dir": str(tmp_path / "runs" / "unit")},
    }
    for key, value in top.items():
        recipe[key] = {**recipe.get(key, {}), **value} if isinstance(value, dict) else value
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def _checkpoint(run_dir: Path, step: int, complete: bool) -> Path:
    folder = run_dir / "checkpoints" / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (run_dir / RUN_MARKER).write_text("{}")  # a run dir ftune created
    (folder / "trainer_state.json").write_text("{}")
    if complete:
        (folder / COMPLETE_MARKER).write_text(json.dumps({"step": step}))
    return folder


def test_single_process_cpu_plan(tmp_path):
    plan = compile_plan(load_recipe(_recipe(tmp_path)))
    assert (plan.device, plan.world_size, plan.num_processes) == ("cpu", 1, 1)
    assert plan.effective_batch_size == 4 * 2 * 1
    assert plan.run_dir == str(tmp_path / "runs" / "unit")
    assert plan.resume_from is None
    cmd = plan.launch.command
    assert "accelerate" in " ".join(cmd) and cmd[-1] == str(tmp_path / "runs" / "unit" / "plan.json")
    assert "ftune.worker" in cmd


def test_default_run_dir_is_runs_name(tmp_path, monkeypatch):
    path = _recipe(tmp_path, output={"dir": None})
    monkeypatch.chdir(tmp_path)
    assert compile_plan(load_recipe(path)).run_dir == str(tmp_path / "runs" / "unit")


def test_resume_auto_takes_latest_complete_checkpoint(tmp_path):
    run_dir = tmp_path / "runs" / "unit"
    _checkpoint(run_dir, 4, complete=True)
    good = _checkpoint(run_dir, 8, complete=True)
    _checkpoint(run_dir, 12, complete=False)  # killed mid-save: no marker, never trusted
    assert RunDir(run_dir).latest_complete_checkpoint() == good
    plan = compile_plan(load_recipe(_recipe(tmp_path)))
    assert plan.resume_from == str(good)


def test_a_resumed_run_does_not_evaluate_its_start_again(tmp_path):
    """eval.on_start evaluates the model before training; a resumed run's start was evaluated (and logged) by the
    run it continues, and a second evaluation there would count for early stopping as one without improvement."""
    on_start = ["eval.on_start=true", "data.eval.split=0.5"]
    recipe = _recipe(tmp_path)
    (tmp_path / "train.jsonl").write_text('{"text": "hello"}\n' * 2)  # one row would hold out none: refused
    assert compile_plan(load_recipe(recipe, on_start)).trainer["eval_on_start"] is True
    _checkpoint(tmp_path / "runs" / "unit", 4, complete=True)
    plan = compile_plan(load_recipe(recipe, on_start))
    assert plan.resume_from is not None and plan.trainer["eval_on_start"] is False


def test_resume_false_starts_fresh(tmp_path):
    _checkpoint(tmp_path / "runs" / "unit", 4, complete=True)
    plan = compile_plan(load_recipe(_recipe(tmp_path), ["checkpoint.resume=false"]))
    assert plan.resume_from is None


def test_resume_path_must_be_a_checkpoint(tmp_path):
    with pytest.raises(RecipeError) as info:
        compile_plan(load_recipe(_recipe(tmp_path), [f"checkpoint.resume={tmp_path}"]))
    (problem,) = info.value.problems
    assert problem.path == "checkpoint.resume" and "not a complete checkpoint" in problem.message
    assert problem.location.origin == "override"


def test_finished_run_is_refused_unless_overwrite(tmp_path):
    final = tmp_path / "runs" / "unit" / "final"
    final.mkdir(parents=True)
    (final / COMPLETE_MARKER).write_text("{}")
    (final.parent / RUN_MARKER).write_text("{}")
    with pytest.raises(RecipeError) as info:
        compile_plan(load_recipe(_recipe(tmp_path)))
    (problem,) = info.value.problems
    assert problem.path == "output.dir" and "already holds a finished run" in problem.message
    assert "output.overwrite=true" in problem.hint
    assert problem.location.file.endswith("recipe.yaml") and problem.location.line is not None
    compile_plan(load_recipe(_recipe(tmp_path), ["output.overwrite=true"]))


def test_fp16_on_cpu_is_a_located_error_and_all_problems_come_at_once(tmp_path):
    path = _recipe(tmp_path, train={"mixed_precision": "fp16"}, model={"path": str(tmp_path / "nope")})
    with pytest.raises(RecipeError) as info:
        compile_plan(load_recipe(path))
    by_path = {p.path: p for p in info.value.problems}
    assert set(by_path) == {"train.mixed_precision", "model.path"}
    assert "bf16" in by_path["train.mixed_precision"].hint
    assert by_path["train.mixed_precision"].location.line is not None


def test_bf16_on_cpu_is_allowed_with_a_note(tmp_path):
    plan = compile_plan(load_recipe(_recipe(tmp_path, train={"mixed_precision": "bf16"})))
    assert plan.mixed_precision == "bf16"
    assert any("bf16 on CPU" in note for note in plan.notes)


def test_plan_round_trips_through_json(tmp_path):
    from ftune.plan.plan import Plan

    plan = compile_plan(load_recipe(_recipe(tmp_path)))
    (tmp_path / "plan.json").write_text(plan.model_dump_json())
    again = Plan.load(tmp_path / "plan.json")
    assert again == plan
    assert again.recipe.peft.method == "lora" and again.recipe.peft.r == 8


def test_paged_optimizer_on_cpu_is_refused_without_quantization(tmp_path):
    with pytest.raises(RecipeError) as info:
        compile_plan(load_recipe(_recipe(tmp_path, train={"optimizer": "paged_adamw_8bit"})))
    (problem,) = info.value.problems
    assert problem.path == "train.optimizer" and "paged" in problem.message
    assert problem.location.line is not None


def test_cpu_threads_per_process_are_decided_in_the_plan(tmp_path, monkeypatch):
    """On a quiet machine (forced here): the physical cores divided among the processes; the user's wins."""
    from ftune.plan import threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(threads, "physical_cores", lambda: 4)
    monkeypatch.setattr(threads, "read_load", lambda: threads.CpuLoad(cpus=4, busy=0.0))
    plan = compile_plan(load_recipe(_recipe(tmp_path)))
    assert plan.launch.env["OMP_NUM_THREADS"] == "4" and plan.cpu_threads.threads == 4
    plan2 = compile_plan(load_recipe(_recipe(tmp_path), ["distributed.strategy=ddp", "distributed.num_processes=2"]))
    assert plan2.launch.env["OMP_NUM_THREADS"] == "2"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert compile_plan(load_recipe(_recipe(tmp_path))).launch.env["OMP_NUM_THREADS"] == "3"


def test_missing_relative_data_file_is_refused_like_validate_does(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # a hub is "reachable": org/name ids would pass
    path = _recipe(tmp_path, data={"train": [{"path": "data/train.jsonl"}]})
    with pytest.raises(RecipeError) as info:
        compile_plan(load_recipe(path))
    (problem,) = info.value.problems
    assert problem.path == "data.train[0].path" and "data file not found: data/train.jsonl" in problem.message


def test_a_default_is_located_at_the_nearest_key_the_user_wrote(tmp_path):
    loaded = load_recipe(_recipe(tmp_path))
    assert loaded.origins["train.optimizer"].origin == "default"
    where = loaded.locate("train.optimizer")  # not written: the `train:` section that holds it
    assert where == loaded.origins["train"] and where.line is not None
    assert loaded.locate("checkpoint.resume").file == loaded.file  # no enclosing key written: the file
    assert load_recipe(_recipe(tmp_path), ["train.seed=3"]).locate("train.seed").origin == "override"


def test_the_plan_decides_the_batching(tmp_path):
    """Padding-free packing is a compiled decision (`Plan.collator`), not the worker's: flash-attention with
    packing flattens; sdpa packs padded rows; no packing pads."""
    packed = {"packing": True, "max_seq_length": 64}
    flash = compile_plan(load_recipe(_recipe(tmp_path, data=packed, model={"attn_implementation": "flash_attention_2"})),
                         gpus=1)
    assert flash.collator == "padding_free"
    assert compile_plan(load_recipe(_recipe(tmp_path, data=packed))).collator == "position_ids"
    assert compile_plan(load_recipe(_recipe(tmp_path))).collator == "padding"


@pytest.mark.parametrize(("sections", "uses"), [
    ({}, False),
    ({"quantization": {"bits": 4}}, True),
    ({"train": {"optimizer": "adamw_bnb_8bit"}}, True),
])
def test_the_plan_says_whether_the_worker_needs_bitsandbytes(tmp_path, sections, uses):
    """A run that needs no bitsandbytes keeps it from being imported in the worker (a start 1.5 s shorter)."""
    plan = compile_plan(load_recipe(_recipe(tmp_path, **sections)))
    assert plan.uses_bitsandbytes is uses
