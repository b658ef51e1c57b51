"""What a newcomer reads: plain progress lines, the labelled final loss, the final eval reused, the model card,
`run --dry-run --format json`, the partial target_modules warning and the quoting hint for `'no'`."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml

from ftune.cli.main import main
from ftune.clock import clock
from ftune.worker.callbacks import progress_line
from ftune.worker.report import loss_line


def test_progress_line():
    line = progress_line(30, 120, {"loss": 1.23456, "learning_rate": 2e-4}, 1234.5, 75.0, done=30)
    assert line == "train 30/120  loss 1.2346  lr 2.00e-04  1,234 tok/s  elapsed 0:01:15  eta 0:03:45"
    # resumed at step 20: the pace is that of the 10 steps this process took
    assert progress_line(30, 120, {}, 0.0, 10.0, done=10).endswith("elapsed 0:00:10  eta 0:01:30")
    assert clock(3 * 3600 + 61) == "3:01:01"


def test_the_final_loss_is_labelled_as_the_last_logging_window():
    records = [{"step": 1, "loss": 7.0}, {"step": 10, "loss": 4.0}, {"step": 20, "loss": 2.5},
               {"step": 20, "eval_loss": 2.9}]
    assert loss_line(records) == "train loss 7.0000 (step 1) → 2.5000 (last logging window, steps 11–20)"
    assert loss_line([{"step": 10, "loss": 3.0}]) == "train loss 3.0000 (mean over steps 1–10)"


def _trainer(history, step):
    calls = []
    return SimpleNamespace(state=SimpleNamespace(global_step=step, log_history=history),
                           evaluate=lambda: calls.append(1) or {"eval_loss": 9.0}), calls


def test_the_final_eval_reuses_the_one_at_the_last_step():
    from ftune.worker.main import final_eval

    last = {"eval_loss": 2.0, "eval_runtime": 0.1, "epoch": 1.0, "step": 12}
    trainer, calls = _trainer([{"loss": 3.0, "step": 12}, last, {"train_runtime": 5.0, "step": 12}], 12)
    assert final_eval(trainer) == {"eval_loss": 2.0, "eval_runtime": 0.1, "epoch": 1.0} and calls == []
    trainer, calls = _trainer([{"eval_loss": 2.5, "step": 6}, {"train_runtime": 5.0, "step": 12}], 12)
    assert final_eval(trainer) == {"eval_loss": 9.0} and calls == [1]  # the last eval was earlier: a fresh one


def test_model_card(tmp_path):
    from ftune.plan.compile import compile_plan
    from ftune.recipe import load_recipe
    from ftune.worker.card import model_card
    from tests.unit.test_plan_compile import _recipe

    plan = compile_plan(load_recipe(_recipe(tmp_path)), check_inputs=False)
    card = model_card(plan, {"eval_loss": 1.23456, "eval_runtime": 3.0, "epoch": 2.0, "eval_f1": 0.5}, 10,
                      "name: unit\n")
    assert card.startswith("# unit\n") and "| method | lora (r=8, alpha=16) |" in card
    assert "| training | 10 optimizer steps of at most 10, effective batch 8" in card
    assert "| eval_loss | 1.235 |" in card and "| eval_f1 | 0.5 |" in card
    assert "eval_runtime" not in card and "| epoch" not in card
    assert card.rstrip().endswith("```yaml\nname: unit\n```")
    assert "No eval data" in model_card(plan, {}, 10, "")


@pytest.fixture
def tiny_recipe(tmp_path, tiny_model_dir, text_data_file):
    def write(**peft):
        path = tmp_path / "r.yaml"
        path.write_text(yaml.safe_dump({
            "name": "t", "model": {"path": str(tiny_model_dir)},
            "data": {"train": [{"path": str(text_data_file), "format": "text"}]},
            "peft": {"method": "lora", **peft}, "train": {"max_steps": 2},
            "output": {"dir": str(tmp_path / "run")}}))
        return str(path)
    return write


def test_dry_run_json_is_pure_json_and_a_partial_target_miss_warns(tiny_recipe, capsys):
    assert main(["run", tiny_recipe(target_modules=["q_proj", "query_key_value"]), "--dry-run",
                 "--format", "json"]) == 0
    out = capsys.readouterr()
    plan = json.loads(out.out)  # nothing but the plan on stdout
    assert plan["cpu_threads"]["threads"] >= 1 and plan["launch"]["command"][1:3] == ["-m", "accelerate.commands.launch"]
    assert "warning: peft.target_modules: query_key_value matches no module of the model" in out.err
    assert "r.yaml:" in out.err.split("warning")[0]  # located in the recipe
    assert main(["run", tiny_recipe(target_modules=["q_proj", "v_proj"]), "--dry-run", "--format", "json"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(["run", tiny_recipe(target_modules=["query_key_value"]), "--dry-run"]) == 1  # none: an error


def test_the_hint_for_no_shows_the_shell_quoting(tiny_recipe, capsys):
    assert main(["show", tiny_recipe(), "train.mixed_precision=no"]) == 1
    err = capsys.readouterr()
    assert "quote it: 'no', in an override too: \"train.mixed_precision='no'\"" in err.out + err.err
