"""eval.benchmarks end to end: lm-eval harness tasks measured on the live LoRA model of a tiny run, at the start
and at the end, from the project's own local task (tests/data/benchmarks), offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e._util import base_recipe, ftune, metrics, write_recipe

pytestmark = [pytest.mark.slow, pytest.mark.extended, pytest.mark.skipif(__import__("importlib").util.find_spec("lm_eval") is None,
                                                   reason='needs the lm-eval harness: pip install "ftune[eval]"')]

TASKS = Path(__file__).resolve().parents[1] / "data" / "benchmarks"


def task_folder(dest: Path, data: Path) -> Path:
    """The shipped task YAMLs reading `data` (absolute: the harness reads data_files relative to the working
    directory, and the runs here work in a temporary one)."""
    dest.mkdir(parents=True, exist_ok=True)
    for yaml_file in TASKS.glob("*.yaml"):
        (dest / yaml_file.name).write_text(yaml_file.read_text().replace("tests/data/benchmarks/colors.jsonl", str(data)))
    return dest


def test_a_lora_run_measures_start_and_end_and_the_training_raises_the_score(tmp_path, tiny_model_dir):
    # The rows whose answer is blue: what 24 LoRA steps can teach a random 2-layer model (a colour per thing needs
    # more than it learns in a test's time; measured: 0/20 rows right at the start, 5/20 at the end)
    rows = [r for r in map(json.loads, (TASKS / "colors.jsonl").read_text().splitlines()) if r["target"] == "blue"]
    task_data = tmp_path / "blue.jsonl"
    task_data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    train = tmp_path / "blue-train.jsonl"  # what the task asks, answered
    train.write_text("".join(json.dumps({"text": f"{r['question']} {r['target']}."}) + "\n" for r in rows * 6))
    task_folder(tmp_path / "tasks", task_data)
    recipe = base_recipe(tiny_model_dir, train, name="bench",
                         train={"max_steps": 24, "learning_rate": 5e-2, "logging_steps": 8},
                         eval={"strategy": "no", "benchmarks": {"tasks": ["ftune_colors_mc"], "include": ["tasks"],
                                                                "at": ["start", "end"]}},
                         checkpoint={"strategy": "no"})
    recipe["data"]["eval"] = None
    path = write_recipe(tmp_path, recipe)
    result = ftune("run", str(path), cwd=tmp_path)
    assert result.code == 0, result.text
    run = tmp_path / "runs" / "e2e"
    measured = [m for m in metrics(run) if "bench_at" in m]
    assert [(m["bench_at"], m["step"]) for m in measured] == [("start", 0), ("end", 24)]
    start, end = (m["bench/ftune_colors_mc/acc"] for m in measured)
    assert end > start, (start, end)
    summary = json.loads((run / "summary.json").read_text())["benchmarks"]
    assert summary["start"]["ftune_colors_mc"]["acc"] == start and summary["end"]["ftune_colors_mc"]["acc"] == end
    assert summary["change"]["ftune_colors_mc"]["acc"] == pytest.approx(end - start, abs=1e-12)
    assert summary["best"]["ftune_colors_mc"]["acc"] == {"value": end, "step": 24}
    assert f"benchmark ftune_colors_mc/acc: {start:.4f} -> {end:.4f}" in result.out
    # after the run: the same tasks on final/ (the adapter reloaded on its base) give the end's numbers, and the
    # table puts the start beside them
    after = ftune("eval", str(run), "--benchmarks", "--format", "json", cwd=tmp_path)
    assert after.code == 0, after.text
    report = json.loads(after.out)
    assert report["model"] == str(run / "final") and report["limit"] is None
    assert report["benchmarks"]["ftune_colors_mc"] == pytest.approx(summary["end"]["ftune_colors_mc"], abs=1e-6)
    assert report["start"] == summary["start"]
    table = ftune("eval", str(run), "--benchmarks", cwd=tmp_path, env={"COLUMNS": "200"})
    assert table.code == 0, table.text
    acc = next(line for line in table.out.splitlines() if " acc " in line)
    assert [cell.strip() for cell in acc.split("│")[1:-1]] == [
        "ftune_colors_mc", "acc", f"{start:.4f}", f"{end:.4f}", f"{summary['end']['ftune_colors_mc']['acc_stderr']:.4f}",
        f"{end - start:+.4f}"]
