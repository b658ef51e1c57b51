"""`ftune report` without a browser: what the page says about the recorded runs (tests/data/report_runs, four
small real runs: record.py), the statuses, the overlaid curves and the recipe diff, the refusals, and the worker's
live refresh (`output.report`). The page drawn in Chromium: tests/e2e/test_report_browser.py."""

from __future__ import annotations

import json
import re
import shutil
import socket
from pathlib import Path

import pytest

from ftune.cli.main import main
from ftune.report import read_runs, render_runs
from ftune.report.collect import charts, recipe_diff, read_run
from ftune.rundir import RunDir, read_metrics

RUNS = Path(__file__).resolve().parents[1] / "data" / "report_runs"


def copy_run(name: str, dest: Path) -> Path:
    shutil.copytree(RUNS / name, dest / name)
    return dest / name


def test_statuses_of_the_recorded_runs():
    finished, stopped, rl = (read_run(RUNS / n) for n in ("finished", "stopped", "rl"))
    assert (finished.status.kind, finished.status.text) == ("finished", "finished at step 30")
    assert json.loads((RUNS / "stopped" / "error.json").read_text())["exit_code"] == 143  # SIGTERM
    step = max(r["step"] for r in read_metrics(RunDir(RUNS / "stopped")))  # the last step it logged
    [saved] = (RUNS / "stopped" / "checkpoints").iterdir()
    assert (stopped.status.kind, stopped.status.step) == ("stopped", step)
    assert stopped.status.text == f"stopped at step {step} ({saved.name} saved)"
    assert (rl.status.kind, rl.status.text) == ("finished", "finished at step 16")


def test_a_failed_run_shows_the_error_and_a_killed_one_its_last_step(tmp_path):
    run = copy_run("stopped", tmp_path)
    (run / "error.json").write_text(json.dumps({"kind": "user", "message": "non-finite loss at step 12",
                                                "hint": "lower train.learning_rate", "exit_code": 4}))
    last = max(r["step"] for r in read_metrics(RunDir(run)))
    assert read_run(run).status.text == f"failed at step {last}: non-finite loss at step 12 (hint: lower " \
                                        "train.learning_rate)"
    (run / "error.json").unlink()  # SIGKILL: no error written, no final/
    assert read_run(run).status.kind == "stopped" and read_run(run).status.step == last
    # a live run: its lock held by a process on this host (pid 1 stands for it, as in the output-policy tests)
    (run / ".ftune.lock").write_text(json.dumps({"pid": 1, "host": socket.gethostname(), "command": "ftune run",
                                                 "started": "2026-01-01T00:00:00+00:00"}))
    assert read_run(run).status.text == f"running: step {last} of 200"


def test_charts_hold_every_logged_value_and_the_rl_metrics():
    finished = read_run(RUNS / "finished")
    records = read_metrics(RunDir(RUNS / "finished"))
    by_id = {c.id: c for c in charts([finished])}
    loss = {line["key"]: line["points"] for line in by_id["loss"].lines}
    assert loss["loss"] == [[r["step"], r["loss"]] for r in records if "loss" in r]
    assert loss["eval_loss"] == [[r["step"], r["eval_loss"]] for r in records if "eval_loss" in r]
    assert [p[1] for p in by_id["lr"].lines[0]["points"]] == [r["learning_rate"] for r in records
                                                              if "learning_rate" in r]
    # tokens/s between two train logs: params.json's tokens per step x steps / seconds
    tps = json.loads((RUNS / "finished" / "params.json").read_text())["tokens_per_step"]
    logs = [r for r in records if "loss" in r]
    want = round((logs[1]["step"] - logs[0]["step"]) * tps / (logs[1]["time"] - logs[0]["time"]), 1)
    assert by_id["tokens"].lines[0]["points"][0] == [logs[1]["step"], want]
    assert {"loss", "lr", "grad_norm", "tokens", "eval"} <= set(by_id)

    rl = {c.id: c for c in charts([read_run(RUNS / "rl")])}
    assert {"reward", "kl", "length", "zero_adv"} <= set(rl)
    assert {line["key"] for line in rl["reward"].lines} >= {"reward", "reward_std", "rewards/exact_match/mean"}


def test_two_runs_overlay_their_curves_and_diff_only_the_keys_that_differ():
    runs = read_runs([RUNS / "finished", RUNS / "second"])
    loss = next(c for c in charts(runs) if c.id == "loss")
    assert [(line["run"], line["key"]) for line in loss.lines] == [
        ("finished", "loss"), ("second", "loss"), ("finished", "eval_loss"), ("second", "eval_loss")]
    diff = dict(recipe_diff(runs))
    assert diff["train.learning_rate"] == ["0.005", "0.002"] and diff["peft.r"] == ["8", "4"]
    assert set(diff) == {"name", "train.learning_rate", "peft.r", "output.dir"}


@pytest.mark.parametrize("names", [["finished"], ["stopped"], ["rl"], ["finished", "second"]])
def test_the_page_is_one_file_with_no_url_and_the_summary_numbers(names):
    page = render_runs([RUNS / n for n in names])
    assert not re.search(r"(https?:|//[a-z]|src=|href=|@import|url\()", page, re.I), "the page fetches something"
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page).group(1))
    assert data["runs"] == names
    for name in names:
        summary = json.loads((RUNS / name / "summary.json").read_text()) if (RUNS / name / "summary.json").exists() \
            else {}
        for key, value in summary.items():
            if isinstance(value, (int, float)):
                assert f'data-run="{name}" data-key="{key}" data-value="{value!r}"' in page, key


def test_the_recipe_shows_each_values_origin():
    page = render_runs([RUNS / "finished"])
    assert re.search(r"<th[^>]*>learning_rate</th><td>0\.005</td><td class=\"origin\">finished\.yaml:\d+:\d+</td>", page)
    assert re.search(r"<th[^>]*>optimizer</th><td>&quot;adamw_torch_fused&quot;</td><td class=\"origin\">default</td>", page)
    second = render_runs([RUNS / "second"])
    assert "override train.learning_rate=2e-3" in second


def test_cli_writes_the_run_report_and_refuses_what_it_must(tmp_path, capsys):
    run = copy_run("finished", tmp_path)
    assert main(["report", str(run)]) == 0
    assert (run / "report.html").read_text().startswith("<!doctype html>")
    assert main(["report", str(run)]) == 0  # its own report.html is refreshed in place
    assert main(["report", str(run), str(RUNS / "second")]) == 2
    assert "name it with --out" in capsys.readouterr().err
    out = tmp_path / "compare.html"
    assert main(["report", str(run), str(RUNS / "second"), "--out", str(out)]) == 0
    assert main(["report", str(run), str(RUNS / "second"), "--out", str(out)]) == 2  # exists: --force
    assert main(["report", str(run), str(RUNS / "second"), "--out", str(out), "--force"]) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "no such run dir" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is not a run dir" in err and "Traceback" not in err


def test_the_live_report_is_rewritten_at_each_log(tmp_path):
    """output.report: the worker's callback writes report.html after each metrics line (the run still going)."""
    from types import SimpleNamespace

    from ftune.worker.callbacks import make_callbacks

    run_dir = copy_run("stopped", tmp_path)
    (run_dir / "error.json").unlink()
    run = RunDir(run_dir)
    plan = SimpleNamespace(run=run, recipe=SimpleNamespace(output=SimpleNamespace(report=True),
                                                           peft=SimpleNamespace(uses_peft_library=True)))
    live = next(c for c in make_callbacks(plan) if type(c).__name__ == "LiveReport")
    state = SimpleNamespace(is_world_process_zero=True, global_step=11)
    for step in (11, 12):
        with run.metrics.open("a") as f:
            f.write(json.dumps({"step": step, "epoch": 1.0, "time": 2e9, "loss": 1.5}) + "\n")
        live.on_log(None, state, None, logs={"loss": 1.5})
        data = json.loads(re.search(r'id="report-data">(.*?)</script>', run.report.read_text()).group(1))
        loss = next(c for c in data["charts"] if c["id"] == "loss")["lines"][0]["points"]
        assert loss[-1] == [step, 1.5]


def test_the_demo_ends_by_writing_the_report_of_its_real_model_run(tmp_path, monkeypatch):
    """Stage C's training and measuring stubbed: what the demo adds after them is the run's report.html."""
    from rich.console import Console

    from ftune.demo import __main__ as demo
    from ftune.demo import real

    run = tmp_path / real.RUN_DIR
    shutil.copytree(RUNS / "finished", run)
    monkeypatch.setattr(real, "prepare", lambda workdir: workdir)
    monkeypatch.setattr(demo, "run_stage", lambda *args: 1.0)
    monkeypatch.setattr(real, "measure", lambda workdir: {"steps": 30})
    monkeypatch.setattr(real, "report", lambda figures, console: True)
    console = Console(record=True, width=300)
    assert demo.real_stage(tmp_path, False, console, {}) == ({"steps": 30}, True)
    page = (run / "report.html").read_text()
    assert 'data-status="finished"' in page and "ftune report · finished" in page
    assert f"report: {run / 'report.html'}" in console.export_text()
