"""metrics.jsonl lines are strict JSON: a non-finite value is null and named under `nonfinite`, and ftune's own
reader restores it."""

from __future__ import annotations

import json
import math

import pytest


def _strict(line: str) -> dict:
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(line, parse_constant=refuse)


def test_nonfinite_values_are_null_and_named(tmp_path):
    from ftune.rundir import RunDir
    from ftune.worker.callbacks import metrics_line
    from ftune.rundir import read_metrics

    lines = [metrics_line({"step": 3, "loss": float("nan"), "grad_norm": float("inf"), "learning_rate": 1e-3}),
             metrics_line({"step": 4, "loss": 1.5})]
    first, second = _strict(lines[0]), _strict(lines[1])
    assert first == {"step": 3, "loss": None, "grad_norm": None, "learning_rate": 1e-3,
                     "nonfinite": {"loss": "nan", "grad_norm": "inf"}}
    assert second == {"step": 4, "loss": 1.5}  # finite records are unchanged

    run = RunDir(tmp_path)
    run.metrics.write_text("".join(lines))
    back = read_metrics(run)
    assert math.isnan(back[0]["loss"]) and back[0]["grad_norm"] == math.inf and "nonfinite" not in back[0]
    assert back[1] == {"step": 4, "loss": 1.5}
    with pytest.raises(ValueError):
        _strict(json.dumps({"loss": float("nan")}))  # what the old line was: a strict reader refuses it
