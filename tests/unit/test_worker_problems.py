"""A RecipeError raised in the worker reaches the user with its located problems (issue #37), not only "1 problem in
recipe": the worker writes each problem (key, message, hint) to error.json, the launcher rebuilds the RecipeError,
and `ftune run` locates each problem at the key the user wrote, as at plan time."""

from __future__ import annotations

import json

from ftune.errors import Problem, RecipeError
from ftune.launch import launcher
from ftune.plan.compile import compile_plan
from ftune.recipe import load_recipe

RECIPE = """name: wp
model: {path: m}
data: {train: [{path: d.jsonl}]}
peft:
  method: lora
  target_parameters: [mlp.experts.gate_up_proj]
train: {max_steps: 1}
"""


def test_a_worker_recipe_error_keeps_its_problems_located(tmp_path, monkeypatch):
    from ftune.worker import main as worker

    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.yaml").write_text(RECIPE)
    loaded = load_recipe(tmp_path / "r.yaml")
    plan = compile_plan(loaded, check_inputs=False)
    plan.run.root.mkdir(parents=True)
    (tmp_path / "plan.json").write_text(plan.model_dump_json())
    found = Problem.at("peft.target_parameters", "'mlp.experts.gate_up_proj' names no parameter of the model",
                       "a dense model has no expert tensors: use target_modules")

    def refuse(_plan):
        raise RecipeError([found])

    monkeypatch.setattr(worker, "run_stages", refuse)
    assert worker.main([str(tmp_path / "plan.json")]) == 1
    written = json.loads(plan.run.error.read_text())
    assert written["problems"] == [{"path": "peft.target_parameters", "message": found.message, "hint": found.hint,
                                    "severity": "error"}]

    err = launcher._worker_error(plan.run, kept=True)
    assert isinstance(err, RecipeError) and [p.message for p in err.problems] == [found.message]
    (located,) = loaded.error(err.problems).problems  # what `ftune run` raises
    assert (located.location.line, located.path) == (6, "peft.target_parameters")
    assert "hint: a dense model has no expert tensors" in located.render()
