"""`ftune validate`: formats, exit codes, directory walks with bases, --check-paths, no tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ftune.cli.main import main

GOOD = "name: t\nmodel: {path: m}\ndata: {train: [{path: d.jsonl}]}\ntrain: {max_steps: 5}\n"
BAD = "name: t\nmodel: {path: m}\ndata: {train: [{path: d.jsonl}]}\ntrain:\n  max_steps: 5\n  lr: 1\n"


@pytest.fixture
def tree(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipes" / "bases").mkdir(parents=True)
    (tmp_path / "recipes" / "bases" / "base.yaml").write_text("model: {path: m}\ntrain:\n  max_steps: 5\n")
    (tmp_path / "recipes" / "a.yaml").write_text("name: a\nextends: bases/base.yaml\ndata: {train: [{path: d.jsonl}]}\n")
    (tmp_path / "recipes" / "b.yml").write_text(GOOD)
    return tmp_path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["validate", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_directory_all_valid_bases_checked_through_recipes(tree, capsys):
    code, out, _ = run(capsys, "recipes")
    assert code == 0
    assert out.splitlines() == [
        "recipes/a.yaml: ok",
        "recipes/b.yml: ok",
        "2 recipes checked, all valid; 1 base file checked through the recipes extending them",
    ]


def test_directory_skips_named_accelerate_and_deepspeed_configs_and_run_dirs(tree, capsys):
    """The issue's case: an accelerate config a recipe names was checked as a recipe (19 errors)."""
    (tree / "recipes" / "team.yaml").write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\n"
                                               "num_processes: 8\nmixed_precision: bf16\n")
    (tree / "recipes" / "ds").mkdir()
    (tree / "recipes" / "ds" / "zero3.yaml").write_text("zero_optimization: {stage: 3}\n")
    (tree / "recipes" / "b.yml").write_text(GOOD + "distributed: {strategy: ddp, accelerate_config: team.yaml}\n")
    (tree / "recipes" / "bases" / "base.yaml").write_text("model: {path: m}\ntrain:\n  max_steps: 5\ndistributed:\n"
                                                          "  strategy: deepspeed\n  deepspeed: {config: ../ds/zero3.yaml}\n")
    run_dir = tree / "recipes" / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "ftune_run.json").write_text("{}")
    (run_dir / "accelerate_config.yaml").write_text("distributed_type: NO\n")
    code, out, _ = run(capsys, "recipes")
    assert code == 0, out
    assert out.splitlines() == [
        "recipes/a.yaml: ok",
        "recipes/b.yml: ok",
        "2 recipes checked, all valid; 1 base file checked through the recipes extending them",
        "not recipes, skipped: 2 accelerate/DeepSpeed configs that recipes name (recipes/ds/zero3.yaml, "
        "recipes/team.yaml); 1 file in ftune run dirs (recipes/runs/r1)",
    ]
    code, out, _ = run(capsys, "recipes/team.yaml")  # named on the command line: checked as asked
    assert code == 1


def test_base_error_reported_through_extending_recipe(tree, capsys):
    (tree / "recipes" / "bases" / "base.yaml").write_text("model: {path: m}\ntrain:\n  max_stpes: 5\n")
    code, out, _ = run(capsys, "recipes", "--format", "json")
    assert code == 1
    files = json.loads(out)["files"]
    assert [(f["file"], f["valid"]) for f in files] == [("recipes/a.yaml", False), ("recipes/b.yml", True)]
    rule, err = files[0]["errors"]  # the typo also leaves no training length: both are reported
    assert (rule["file"], rule["line"], rule["path"]) == ("recipes/bases/base.yaml", 2, "train")
    assert err == {
        "file": "recipes/bases/base.yaml",
        "line": 3,
        "column": 3,
        "path": "train.max_stpes",
        "message": "unknown key (did you mean 'max_steps'?)",
        "hint": err["hint"],
    }


def test_text_format_and_exit_1(tree, capsys):
    (tree / "bad.yaml").write_text(BAD)
    code, out, err = run(capsys, "bad.yaml")
    assert code == 1 and err == ""
    assert out.splitlines()[:2] == [
        "bad.yaml:6:3: error: train.lr: unknown key (did you mean 'learning_rate'?)",
        "    hint: allowed keys under `train`: " + out.splitlines()[1].split(": ", 2)[2],
    ]
    assert out.splitlines()[-1] == "1 recipe checked, 1 invalid (1 error)"


def test_github_format(tree, capsys):
    (tree / "bad.yaml").write_text(BAD.replace("lr: 1", "lr_scheduler: cosin"))
    code, out, _ = run(capsys, "bad.yaml", "--format", "github")
    assert code == 1
    (line,) = out.splitlines()
    assert line.startswith(
        "::error file=bad.yaml,line=6,col=17,title=ftune::train.lr_scheduler: invalid value 'cosin' "
        "(did you mean 'cosine'?) (allowed values: linear, cosine,"
    )


def test_github_escapes_properties(tree, capsys):
    (tree / "we,ird.yaml").write_text(BAD)
    _, out, _ = run(capsys, "we,ird.yaml", "--format", "github")
    assert out.startswith("::error file=we%2Cird.yaml,line=6")


def test_missing_path_is_usage_error(tree, capsys):
    code, _, err = run(capsys, "nope.yaml")
    assert code == 2 and "no such file or directory: nope.yaml" in err


def test_overrides_refused(tree, capsys):
    code, _, err = run(capsys, "recipes/b.yml", "train.max_steps=3")
    assert code == 2 and "validate takes no overrides" in err and "ftune show" in err


def test_empty_directory_is_usage_error(tree, capsys):
    (tree / "empty").mkdir()
    code, _, err = run(capsys, "empty")
    assert code == 2 and "no recipe files" in err


def test_check_paths(tree, capsys):
    (tree / "local.yaml").write_text(
        "name: t\nmodel: {path: ./models/tiny}\ndata:\n  train:\n    - path: data/train.jsonl\n    - path: org/hub-set\n"
        "train: {max_steps: 5}\n"
    )
    code, out, _ = run(capsys, "local.yaml")
    assert code == 0  # paths aren't needed without --check-paths (CI has no models or data)
    code, out, _ = run(capsys, "local.yaml", "--check-paths", "--format", "json")
    assert code == 1
    errors = json.loads(out)["files"][0]["errors"]
    assert [(e["path"], e["line"], e["column"]) for e in errors] == [("model.path", 2, 9), ("data.train[0].path", 5, 7)]
    # the compiler's words (`ftune plan` and `ftune run` refuse the same paths with the same message)
    assert [e["message"] for e in errors] == ["model folder not found: ./models/tiny",
                                              "data file not found: data/train.jsonl"]
    (tree / "models" / "tiny").mkdir(parents=True)
    (tree / "data").mkdir()
    (tree / "data" / "train.jsonl").write_text('{"text": "hello"}\n')
    code, out, _ = run(capsys, "local.yaml", "--check-paths", "--format", "json")
    assert code == 1  # the model folder's extras too, in the compiler's words
    assert [e["message"] for e in json.loads(out)["files"][0]["errors"]] == ["./models/tiny has no config.json"]
    (tree / "models" / "tiny" / "config.json").write_text("{}")
    code, _, _ = run(capsys, "local.yaml", "--check-paths")
    assert code == 0  # org/hub-set looks like a hub dataset: not a local path


def test_check_paths_reads_the_first_rows_for_fields(tree, capsys):
    (tree / "data").mkdir()
    (tree / "data" / "train.jsonl").write_text('{"prompt": "a", "answer": "b"}\n')
    (tree / "config.json").write_text("{}")  # model.path `.` is a model folder
    (tree / "local.yaml").write_text(
        "name: t\nmodel: {path: .}\ndata:\n  train:\n    - path: data/train.jsonl\n      format: instruction\n"
        "train: {max_steps: 5}\n"
    )
    code, out, _ = run(capsys, "local.yaml", "--check-paths", "--format", "json")
    assert code == 1
    (error, *_) = json.loads(out)["files"][0]["errors"]
    assert error["path"].startswith("data.train[0]")
    assert "instruction" in error["message"] and error["line"] == 5
    assert "prompt" in (error["message"] + (error["hint"] or ""))  # names the fields that are there


def test_file_named_explicitly_is_checked_even_if_a_base(tree, capsys):
    code, out, _ = run(capsys, "recipes/bases/base.yaml", "recipes/a.yaml")
    assert code == 1  # a base alone lacks name and data
    assert "recipes/bases/base.yaml:1:1: error: name: required key is missing" in out


NEW_USER_CASES = {
    "typo": (BAD, "train.lr: unknown key"),
    "wrong-type": (GOOD.replace("max_steps: 5", "max_steps: '5x'"), "expected an integer"),
    "indentation": (GOOD + "eval:\n  strategy: epoch\n    steps: 3\n", "YAML syntax error"),
    "duplicate-key": (GOOD + "name: u\n", "duplicate key 'name'"),
    "missing-base": (GOOD + "extends: nowhere.yaml\n", "base recipe not found"),
    "cycle": (GOOD + "extends: case.yaml\n", "extends cycle"),
    "python-tag": (GOOD + "description: !!python/object/apply:os.system [ls]\n", "is not allowed"),
    "alias-bomb": (
        'a: &a ["x","x","x","x","x","x","x","x","x","x"]\n'
        + "".join(f"{c}: &{c} [" + ",".join([f"*{p}"] * 10) + "]\n" for p, c in zip("abcdefgh", "bcdefghi")),
        "alias bomb",
    ),
}


@pytest.mark.parametrize("case", list(NEW_USER_CASES))
def test_new_user_cases_subprocess(tmp_path, case):
    """As a new user would: a located error, exit 1, no traceback."""
    text, fragment = NEW_USER_CASES[case]
    (tmp_path / "case.yaml").write_text(text)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run(
        [sys.executable, "-m", "ftune.cli.main", "validate", "case.yaml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("case.yaml:") and ": error: " in first, first
    line, col = first.split(":")[1:3]
    assert line.isdigit() and col.isdigit()
    assert fragment in proc.stdout
    assert "    hint: " in proc.stdout


def test_unreadable_file_is_io_error(tree, capsys, monkeypatch):
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: not str(p).endswith("locked.yaml") and real_access(p, mode))
    (tree / "locked.yaml").write_text(GOOD)
    code, out, _ = run(capsys, "locked.yaml", "recipes/b.yml")
    assert code == 2
    assert out.splitlines()[0] == "locked.yaml: error: can't read recipe file locked.yaml: permission denied"
