"""The prepared GPU suite (bench/gpu_suite.py) runs end to end on a CPU in its smoke mode: every part is recorded
(run, skipped for want of CUDA, or not run once the budget is spent), and the results file is written after each
part, so a run cut short keeps what it measured. Its figures mean nothing here; the GPU run's go to
bench/results/ and docs/performance.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def suite(tmp_path, *args: str) -> dict:
    out = tmp_path / "gpu.json"
    env = {**os.environ, "FTUNE_BENCH_SMOKE": "1", "FTUNE_BENCH_ASSETS": str(tmp_path / "assets")}
    proc = subprocess.run([sys.executable, str(REPO / "bench/gpu_suite.py"), "--out", str(out), *args],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_the_cpu_parts_run_and_the_cuda_parts_are_recorded_as_skipped(tmp_path):
    result = suite(tmp_path, "--parts", "env,long-8b,qlora-8b,fp8-8b,grpo-1.5b,gpu-tests")
    parts = result["parts"]
    assert result["smoke"] is True
    assert list(parts) == ["env", "long-8b", "qlora-8b", "fp8-8b", "grpo-1.5b", "gpu-tests"]
    assert parts["env"]["result"]["torch"] and parts["env"]["result"]["device"] == "cpu"
    # the plan's longest row on an 80 GiB device: the tiny model's 256 positions bound it, not the memory
    assert parts["long-8b"]["status"] == "ok" and parts["long-8b"]["result"]["plan_longest_seq"] == 256
    assert all(parts[p]["status"] == "skipped" for p in ("qlora-8b", "grpo-1.5b", "gpu-tests"))
    # fp8 on a CPU: the plan's estimate (as on an 80 GiB GPU) and this device's refusal at train.precision
    fp8 = parts["fp8-8b"]
    assert fp8["status"] == "ok" and fp8["result"]["plan_fp8"]["converted_layers"] > 0, fp8
    assert "train.precision" in fp8["result"]["refused_here"] and "8.9" in fp8["result"]["refused_here"]


def test_a_spent_budget_still_writes_every_part(tmp_path):
    parts = suite(tmp_path, "--budget", "5")["parts"]
    assert [p for p, row in parts.items() if row["status"] != "not run"] == []
    assert "lora-8b" in parts and "full-3b" in parts


@pytest.mark.extended
def test_the_lora_part_compares_ftune_with_the_plain_script(tmp_path):
    row = suite(tmp_path, "--parts", "lora-8b")["parts"]["lora-8b"]["result"]["variants"]["lora"]
    assert row["tokens_per_s"] > 0 and row["plain"]["tokens_per_s"] > 0 and row["ftune_over_plain"] > 0
    assert row["threads"] >= 1 and row["plan_peak_bytes"] > 0
