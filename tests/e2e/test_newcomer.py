"""A newcomer's run, through the real CLI with stdout piped (as under nohup, CI or Slurm): ShareGPT and Alpaca
data named as other tools name them, one progress line per logging step, the final eval once, a predictions file
holding every eval prompt, a labelled final train loss and a model card in final/."""

from __future__ import annotations

import json
import random
import re

import pytest

from tests.e2e._util import base_recipe, ftune, metrics, write_recipe

pytestmark = pytest.mark.slow
STEPS, LOGGING = 12, 3


@pytest.fixture(scope="module")
def piped_run(tmp_path_factory, tiny_model_dir):
    folder = tmp_path_factory.mktemp("newcomer")
    rng = random.Random(5)
    sharegpt = folder / "sharegpt.jsonl"
    sharegpt.write_text("".join(json.dumps({"conversations": [
        {"from": "system", "value": "answer briefly"},
        {"from": "human", "value": f"add {a} and {b}"},
        {"from": "gpt", "value": f"the cat sat {a + b}"}]}) + "\n"
        for a, b in ((rng.randint(0, 9), rng.randint(0, 9)) for _ in range(60))))
    alpaca = folder / "alpaca.jsonl"
    alpaca.write_text("".join(json.dumps({"instruction": f"double {a}", "input": "", "output": f"{2 * a}"}) + "\n"
                              for a in (rng.randint(0, 9) for _ in range(60))))
    recipe = base_recipe(tiny_model_dir, sharegpt, name="newcomer",
                         data={"train": [{"path": str(sharegpt), "format": "sharegpt"},
                                         {"path": str(alpaca), "format": "alpaca", "template": "{instruction} ="}],
                               "eval": {"split": 0.1}, "max_seq_length": 64},
                         train={"max_steps": STEPS, "logging_steps": LOGGING, "learning_rate": 1e-2},
                         eval={"strategy": "steps", "steps": 6, "generate": {"max_new_tokens": 4}},
                         checkpoint={"strategy": "no"},
                         output={"dir": "runs/n", "report_to": ["none"], "loss_curve": False})
    path = write_recipe(folder, recipe)
    res = ftune("run", str(path), cwd=folder)  # capture_output: stdout is a pipe, not a terminal
    assert res.code == 0, res.text
    return folder, path, folder / "runs" / "n", res


def test_aliases_validate_and_show_their_expansion(piped_run, capsys):
    from ftune.cli.main import main

    _, path, _, _ = piped_run
    assert main(["validate", str(path)]) == 0
    capsys.readouterr()
    assert main(["show", str(path), "--format", "json"]) == 0
    sources = json.loads(capsys.readouterr().out)["data"]["train"]
    assert sources[0]["format"] == "chat"
    assert {"messages": "conversations", "role": "from", "content": "value"}.items() <= sources[0]["fields"].items()
    assert sources[0]["roles"] == {"human": "user", "gpt": "assistant", "system": "system"}
    assert sources[1]["format"] == "instruction"


def test_piped_stdout_gets_one_progress_line_per_logging_step(piped_run):
    _, _, run, res = piped_run
    lines = [line for line in res.out.splitlines() if re.match(r"train \d+/", line)]
    steps = [int(re.match(r"train (\d+)/", line)[1]) for line in lines]
    logged_steps = [m["step"] for m in metrics(run) if "loss" in m]
    assert steps == logged_steps == [1, *range(LOGGING, STEPS + 1, LOGGING)], res.out  # the first step is logged too
    assert all(f"/{STEPS}  loss " in line and " lr " in line and " tok/s  elapsed 0:" in line and "  eta 0:" in line
               for line in lines), lines
    logged = [m["loss"] for m in metrics(run) if "loss" in m]
    assert [float(line.split("loss ")[1].split()[0]) for line in lines] == pytest.approx(logged, abs=1e-4)


def test_the_final_eval_runs_once(piped_run):
    _, _, run, _ = piped_run
    evals = [m["step"] for m in metrics(run) if "eval_loss" in m]
    assert evals == [6, STEPS]  # eval.steps lands on the last step: that eval is the final one, not a second


def test_predictions_hold_every_eval_prompt(piped_run):
    _, _, run, res = piped_run
    rows = [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]
    generated = next(m for m in metrics(run) if "eval_generated" in m)
    assert len(rows) == generated["eval_generated"] == 12  # 10% of 120 rows held out, all with prompts
    assert all(set(r) == {"prompt", "reference", "completion", "stopped", "scores"} for r in rows)
    assert all(list(r["scores"]) == ["f1"] for r in rows)  # chat data: word overlap, not exact match
    assert sum(r["scores"]["f1"] for r in rows) / len(rows) == pytest.approx(generated["eval_f1"])
    assert "eval_exact_match" not in generated
    assert sum("add " in r["prompt"] for r in rows) + sum("double " in r["prompt"] for r in rows) == len(rows)


def test_summary_labels_the_loss_and_final_has_a_model_card(piped_run):
    _, _, run, res = piped_run
    last = [m for m in metrics(run) if "loss" in m][-1]["loss"]
    assert f"→ {last:.4f} (last logging window, steps {STEPS - LOGGING + 1}–{STEPS})" in res.out
    card = (run / "final" / "README.md").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert "# newcomer" in card and "| method | lora (r=8, alpha=16) |" in card
    assert f"{STEPS} optimizer steps of at most {STEPS}" in card and "sharegpt.jsonl` (chat)" in card
    assert f"| eval_loss | {summary['eval_loss']:.4g} |" in card and "messages: conversations" in card  # the recipe
