"""Degenerate preference data is checked before launch (by the compiler: `ftune plan`, `ftune run`; and
`validate --check-paths`): pairs whose chosen
equals rejected (refused above half of the rows, warned below, with row numbers) and one-sided KTO labels (refused).
On main, DPO on identical pairs and KTO on desirable-only rows trained a flat loss and exited 0."""

from __future__ import annotations

import json

import yaml

from ftune.cli.main import main


def _recipe(tmp_path, tiny_model_dir, objective: str, rows: list[dict]) -> str:
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fmt = "unpaired-preference" if objective == "kto" else "preference"
    recipe = {"name": "pref", "model": {"path": str(tiny_model_dir), "dtype": "float32"},
              "data": {"train": [{"path": str(data), "format": fmt}], "max_seq_length": 32},
              "train": {"objective": objective, "max_steps": 1, "per_device_batch_size": 2},
              "output": {"dir": str(tmp_path / "run"), "report_to": ["none"]}}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return str(path)


def _pair(i: int, same: bool) -> dict:
    return {"prompt": f"q{i}", "chosen": f"good {i}", "rejected": f"good {i}" if same else f"bad {i}"}


def test_identical_pairs_refuse_the_run_above_half_and_warn_below(tmp_path, tiny_model_dir, capsys):
    recipe = _recipe(tmp_path, tiny_model_dir, "dpo", [_pair(i, same=i != 3) for i in range(1, 11)])
    assert main(["run", recipe, "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert "r.yaml:" in err and "data.train[0].path: 9 of 10 rows of" in err and "(90%)" in err
    assert "rows 1, 2, 4, 5, 6, 7, 8, 9, ... (1 more)" in err and "log 2 = 0.693" in err
    assert main(["validate", "--check-paths", recipe]) == 1  # the same check in validate
    assert main(["plan", recipe]) == 1  # and in the compiler: `plan` refuses what `run` refuses
    err = capsys.readouterr().err
    assert "r.yaml:7:5: error: data.train[0].path: 9 of 10 rows of" in err, err
    assert not (tmp_path / "run").exists()
    recipe = _recipe(tmp_path, tiny_model_dir, "dpo", [_pair(i, same=i == 4) for i in range(1, 11)])
    assert main(["run", recipe, "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "r.yaml:7:5: warning: data.train[0].path: 1 of 10 rows" in err and "(rows 4)" in err


def test_one_sided_kto_labels_refuse_the_run(tmp_path, tiny_model_dir, capsys):
    rows = [{"prompt": f"q{i}", "completion": f"a{i}", "label": True} for i in range(6)]
    recipe = _recipe(tmp_path, tiny_model_dir, "kto", rows)
    assert main(["run", recipe, "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert "data.train[0].fields.label: all 6 labelled rows of" in err and "are desirable (true)" in err
    assert main(["plan", recipe]) == 1
    assert "data.train[0].fields.label: all 6 labelled rows of" in capsys.readouterr().err
    rows[2]["label"] = False
    assert main(["run", _recipe(tmp_path, tiny_model_dir, "kto", rows), "--dry-run"]) == 0
