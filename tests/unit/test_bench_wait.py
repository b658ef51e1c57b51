"""bench/bench_wait.py (#42): its rows and its summary, without running a model."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def _bench():
    path = Path(__file__).resolve().parents[2] / "bench" / "bench_wait.py"
    spec = importlib.util.spec_from_file_location("bench_wait", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_only_the_default_row_leaves_the_decision_to_ftune():
    """An OMP_NUM_THREADS in the environment keeps ftune's hands off the wait policy (ftune.plan.threads), so every
    other row runs exactly its own setting."""
    settings = _bench().SETTINGS
    assert settings["ftune default"] == {} and settings["plain script"] is None
    assert all(env["OMP_NUM_THREADS"] for name, env in settings.items() if env)
    assert all("," not in name for name in settings)  # --settings splits on commas


def test_the_summary_is_each_rows_time_over_the_rounds_best():
    rows = [{"round": r, "condition": "hogs", "setting": name, "load1": 4.0, "train_s": t}
            for r, times in ((1, {"1 thread": 20.0, "2 threads passive": 10.0}),
                             (2, {"1 thread": 15.0, "2 threads passive": 12.0})) for name, t in times.items()]
    rows.append({"round": 1, "condition": "hogs", "setting": "2 threads active", "load1": 4.0, "timed_out": 180})
    assert _bench().summary(rows) == [
        "hogs   1 thread                     ÷ best: median 1.62 (1.25-2.00), load 4.0-4.0",
        "hogs   2 threads passive            ÷ best: median 1.00 (1.00-1.00), load 4.0-4.0",
        "hogs   2 threads active             no finished run",
    ]
