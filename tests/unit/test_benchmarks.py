"""eval.benchmarks' light side: the task names read by hand (the installed harness's, the include folders'), the
located checks of `validate` and the compiler, summary.json's arithmetic, the harness's results read back."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ftune import benchmarks
from ftune.benchmarks.harness import scores
from ftune.cli.main import main
from ftune.recipe.schema import BenchmarksEval
from tests.unit.test_light_imports import HEAVY, PROBE, REPO

TASKS = REPO / "tests" / "data" / "benchmarks"
HARNESS = importlib.util.find_spec("lm_eval") is not None


def test_top_level_names_of_a_harness_yaml_are_read_by_hand():
    text = ('"task": "mmlu_x"\ninclude: _t\ntag:\n  - mmlu_stem\n  - "mmlu_all"\ndataset_kwargs:\n  task: nested\n'
            "group: grp # a comment\n")
    assert benchmarks._names_in(text) == {"mmlu_x", "mmlu_stem", "mmlu_all", "grp"}
    assert benchmarks._names_in("tag: [a_b, 'c-d']\ntask: !function x.y\n") == {"a_b", "c-d"}


def test_the_shipped_local_tasks_and_their_data():
    local = benchmarks.local_tasks(TASKS)
    assert set(local) == {"ftune_colors_mc", "ftune_colors_gen"}
    assert local["ftune_colors_mc"].data_files == ("tests/data/benchmarks/colors.jsonl",)
    rows = (TASKS / "colors.jsonl").read_text().splitlines()
    assert len(rows) == 120


def _bench(**kw) -> BenchmarksEval:
    return BenchmarksEval(**{"tasks": ["ftune_colors_mc"], "include": [str(TASKS)], **kw})


def test_an_unknown_name_gets_did_you_mean_from_the_include_folders(monkeypatch):
    monkeypatch.setattr(benchmarks, "harness_installed", lambda: True)
    monkeypatch.setattr(benchmarks, "installed_names", lambda: frozenset({"arc_easy"}))
    monkeypatch.setattr(benchmarks, "known", lambda name: name == "arc_easy")
    found = benchmarks.problems(_bench(tasks=["ftune_colors_mc", "ftune_colors_mx", "arc_easy", "arc_eazy"]),
                                REPO, check_paths=False, need_harness=True)
    assert [(p.path, p.message, p.hint) for p in found] == [
        ("eval.benchmarks.tasks[1]", "unknown benchmark task 'ftune_colors_mx': not in the installed lm-eval harness "
         "or the include folders", "did you mean 'ftune_colors_mc'?"),
        ("eval.benchmarks.tasks[3]", "unknown benchmark task 'arc_eazy': not in the installed lm-eval harness or the "
         "include folders", "did you mean 'arc_easy'?")]


def test_without_the_harness_the_compiler_refuses_with_the_install_line(monkeypatch):
    monkeypatch.setattr(benchmarks, "harness_installed", lambda: False)
    found = benchmarks.problems(_bench(tasks=["arc_easy"]), REPO, check_paths=False, need_harness=True)
    assert [(p.path, p.hint) for p in found] == [("eval.benchmarks",
                                                   'pip install "ftune[eval]"   (or remove eval.benchmarks)')]
    assert benchmarks.problems(_bench(tasks=["arc_easy"]), REPO, check_paths=False, need_harness=False) == []


def test_check_paths_names_a_missing_folder_and_a_missing_data_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the harness reads data_files relative to the working directory: not here
    monkeypatch.setattr(benchmarks, "harness_installed", lambda: True)
    found = benchmarks.problems(_bench(include=[str(TASKS), "nowhere"]), tmp_path, check_paths=True,
                                need_harness=True)
    assert [p.path for p in found] == ["eval.benchmarks.include[1]", "eval.benchmarks.tasks[0]"]
    assert found[0].message == f"task folder not found: {tmp_path / 'nowhere'}"
    found = benchmarks.problems(_bench(), tmp_path, check_paths=True, need_harness=True)
    assert [p.path for p in found] == ["eval.benchmarks.tasks[0]"]
    assert "reads tests/data/benchmarks/colors.jsonl, which does not exist" in found[0].message
    monkeypatch.chdir(REPO)
    assert benchmarks.problems(_bench(), tmp_path, check_paths=True, need_harness=True) == []


def test_validate_locates_a_misspelt_task_and_stays_light(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(benchmarks, "harness_installed", lambda: True)
    (tmp_path / "tasks").symlink_to(TASKS)
    recipe = {"schema_version": 1, "name": "b", "model": {"path": "m"}, "data": {"train": [{"path": "d.jsonl"}]},
              "train": {"max_steps": 10}, "eval": {"benchmarks": {"tasks": ["ftune_colors_gem"], "include": ["tasks"]}}}
    file = tmp_path / "r.yaml"
    file.write_text(yaml.safe_dump(recipe, sort_keys=False))
    assert main(["validate", str(file)]) == 1
    err = "".join(capsys.readouterr())
    line = file.read_text().splitlines().index("    - ftune_colors_gem") + 1
    assert f"r.yaml:{line}:" in err and "unknown benchmark task 'ftune_colors_gem'" in err
    assert "did you mean 'ftune_colors_gen'?" in err
    recipe["eval"]["benchmarks"]["tasks"] = ["ftune_colors_gen"]
    file.write_text(yaml.safe_dump(recipe, sort_keys=False))
    proc = subprocess.run([sys.executable, "-c", PROBE.format(argv=["validate", str(file)], heavy=(*HEAVY, "lm_eval"))],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "HEAVY="


def test_at_steps_needs_evaluations():
    from ftune.recipe.rules.core import benchmarks_at_steps_needs_evals
    from ftune.recipe.schema import Recipe

    base = {"schema_version": 1, "name": "b", "model": {"path": "m"}, "data": {"train": [{"path": "d.jsonl"}]}}
    recipe = Recipe.model_validate({**base, "eval": {"benchmarks": {"tasks": ["x"], "at": ["start", "steps"]}}})
    assert [p.path for p in benchmarks_at_steps_needs_evals(recipe)] == ["eval.benchmarks.at"]
    recipe = Recipe.model_validate({**base, "eval": {"strategy": "steps", "steps": 5,
                                                     "benchmarks": {"tasks": ["x"], "at": ["steps"]}}})
    assert list(benchmarks_at_steps_needs_evals(recipe)) == []


def test_the_harness_results_and_the_summary_arithmetic():
    results = {"t": {"alias": "t", "acc,none": 0.25, "acc_stderr,none": 0.1, "exact_match,first-word": 0.5,
                     "exact_match_stderr,first-word": "N/A", "sample_len": 3}}
    assert scores(results) == {"t": {"acc": 0.25, "acc_stderr": 0.1, "exact_match,first-word": 0.5}}
    rows = [{"step": 0, "bench_at": "start", "bench/t/acc": 0.25, "bench/t/acc_stderr": 0.1, "bench/t/ppl": 9.0},
            {"step": 5, "loss": 1.0},
            {"step": 5, "bench_at": "steps", "bench/t/acc": 0.75, "bench/t/acc_stderr": 0.1,
             "bench/t/word_perplexity": 3.0},
            {"step": 10, "bench_at": "end", "bench/t/acc": 0.5, "bench/t/acc_stderr": 0.1,
             "bench/t/word_perplexity": 4.0}]
    rows[0]["bench/t/word_perplexity"] = rows[0].pop("bench/t/ppl")
    summary = benchmarks.summary(rows)
    assert summary["start"] == {"t": {"acc": 0.25, "acc_stderr": 0.1, "word_perplexity": 9.0}}
    assert summary["end"] == {"t": {"acc": 0.5, "acc_stderr": 0.1, "word_perplexity": 4.0}} and summary["end_step"] == 10
    assert summary["best"] == {"t": {"acc": {"value": 0.75, "step": 5}, "word_perplexity": {"value": 3.0, "step": 5}}}
    assert summary["change"] == {"t": {"acc": 0.25, "word_perplexity": -5.0}}
    assert benchmarks.summary([{"step": 1, "loss": 2.0}]) is None


@pytest.mark.skipif(not HARNESS, reason='needs the lm-eval harness: pip install "ftune[eval]"')
def test_the_installed_names_hold_the_common_benchmarks():
    names = benchmarks.installed_names()
    assert {"arc_easy", "hellaswag", "mmlu", "gsm8k", "winogrande"} <= names
    assert benchmarks.known("afrobench_xqa_tasks") and not benchmarks.known("arc_eassy")  # a group in a group's list
