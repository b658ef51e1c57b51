"""The prepared GPU suite (bench/gpu_suite.py) runs end to end on a CPU in its smoke mode: every part is recorded
(run, skipped for want of CUDA, or not run once the budget is spent), and the results file is written after each
part, so a run cut short keeps what it measured. Its figures mean nothing here; the GPU run's go to
bench/results/ and docs/performance.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def suite(tmp_path, *args: str) -> dict:
    out = tmp_path / "gpu.json"
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "FTUNE_BENCH_SMOKE": "1", "FTUNE_BENCH_ASSETS": str(tmp_path / "assets"),
           "FTUNE_BENCH_WHEELS": str(tmp_path / "wheels"), "TMPDIR": str(tmp_path / "tmp")}
    proc = subprocess.run([sys.executable, str(REPO / "bench/gpu_suite.py"), "--out", str(out), *args],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_the_cpu_parts_run_and_the_cuda_parts_are_recorded_as_skipped(tmp_path):
    result = suite(tmp_path, "--parts", "env,long-8b,qlora-8b,grpo-1.5b,gpu-tests,fp8-8b,vlm-qwen2")
    parts = result["parts"]
    assert result["smoke"] is True
    assert list(parts) == ["env", "long-8b", "qlora-8b", "grpo-1.5b", "gpu-tests", "fp8-8b", "vlm-qwen2"]
    if _suite_module().torchvision_works() is not None:  # no wheel carried (FTUNE_BENCH_WHEELS is empty here)
        assert parts["vlm-qwen2"]["status"] == "skipped", parts["vlm-qwen2"]
        assert parts["vlm-qwen2"]["why"].startswith("no torchvision wheel (none in "), parts["vlm-qwen2"]
    assert parts["env"]["result"]["torch"] and parts["env"]["result"]["device"] == "cpu"
    # the plan's longest row on an 80 GiB device: the tiny model's 256 positions bound it, not the memory
    long = parts["long-8b"]["result"]
    assert parts["long-8b"]["status"] == "ok" and long["plan_longest_seq"] == 256
    assert long["loss_lever"] == ({"kernels": "liger"} if _has("liger_kernel") else {"tiled_loss": True})
    assert long["plan_longest_seq_alst_levers"] == 256  # offloaded checkpoints + tiled MLP planned too
    assert any(n.startswith("longest row:") for n in long["plan_notes_alst_levers"]), long
    # full fine-tuning as ftune sets up ALST's on one GPU (FSDP2 CPU offload, Liger, every lever): planned too, with
    # the host memory it offloads at the planned row and at the longest; the states stay, the checkpoints grow
    assert long["plan_longest_seq_full_alst_levers"] == 256
    assert any(n.startswith("longest row:") for n in long["plan_notes_full_alst_levers"]), long
    planned = long["plan_offloaded_bytes_full_alst_levers"]
    at_longest = long["plan_offloaded_bytes_full_alst_levers_at_longest"]
    assert (planned["seq"], at_longest["seq"]) == (64, 256) and 0 < planned["bytes"] < at_longest["bytes"], long
    assert all(parts[p]["status"] == "skipped" for p in ("qlora-8b", "grpo-1.5b", "gpu-tests"))
    # fp8 on a CPU: the plan's estimate (as on an 80 GiB GPU) and this device's refusal at train.precision
    fp8 = parts["fp8-8b"]
    assert fp8["status"] == "ok" and fp8["result"]["plan_fp8"]["converted_layers"] > 0, fp8
    assert "train.precision" in fp8["result"]["refused_here"] and "8.9" in fp8["result"]["refused_here"]
    # what the parts wrote (recipes, runs, result files) went to the suite's scratch folder, removed at its end
    assert list((tmp_path / "tmp").iterdir()) == []


def _has(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is not None


def _suite_module():
    import importlib.util

    if "gpu_suite" not in sys.modules:  # its dataclass looks its module up there
        spec = importlib.util.spec_from_file_location("gpu_suite", REPO / "bench" / "gpu_suite.py")
        sys.modules["gpu_suite"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["gpu_suite"])
    return sys.modules["gpu_suite"]


@pytest.mark.parametrize("torch_version,want", [("2.11.0+cu130", "0.26"), ("2.13.0", "0.28"), ("2.5.1", "0.20")])
def test_the_torchvision_release_for_a_torch_release(torch_version, want):
    assert _suite_module().torchvision_for(torch_version) == want


def test_the_vlm_part_installs_the_matching_carried_wheel_or_says_why_not(tmp_path, monkeypatch):
    """Every branch of torchvision_ready forced: works already; no wheel; wheels for another torch; the matching
    wheel installed (pip's argv checked) and then working, or still failing (a CPU/CUDA mismatch)."""
    import torch

    suite_mod = _suite_module()
    want = suite_mod.torchvision_for(torch.__version__)
    works = iter([])
    monkeypatch.setattr(suite_mod, "torchvision_works", lambda: next(works))
    installed = []
    monkeypatch.setattr(suite_mod, "_run", lambda argv, env, timeout: installed.append(argv) or ("ok", "", ""))
    works = iter([None])
    assert suite_mod.torchvision_ready(tmp_path / "none") is None and installed == []
    works = iter(["ModuleNotFoundError: No module named 'torchvision'"])
    assert suite_mod.torchvision_ready(tmp_path / "none").startswith("no torchvision wheel (none in ")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "torchvision-0.1.0-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    works = iter(["x"])
    why = suite_mod.torchvision_ready(wheels)
    assert why.startswith(f"no torchvision wheel for torch {torch.__version__} (torchvision {want})") and \
        "torchvision-0.1.0-" in why and installed == []
    right = wheels / f"torchvision-{want}.0+cu130-cp311-cp311-manylinux_2_28_x86_64.whl"
    right.write_bytes(b"")
    works = iter(["x", None])
    assert suite_mod.torchvision_ready(wheels) is None

    assert "--no-index" in installed[-1] and installed[-1][-1] == str(right)
    works = iter(["x", "RuntimeError: operator torchvision::nms does not exist"])
    assert suite_mod.torchvision_ready(wheels) == (f"{right.name} is installed but fails with torch "
                                                   f"{torch.__version__}: RuntimeError: operator torchvision::nms "
                                                   "does not exist")


def test_a_part_that_times_out_takes_the_processes_it_started_with_it(tmp_path):
    """A timed-out part's process group is killed, so a plain script or `ftune run` it started doesn't keep the GPU
    into the next part. The part's command starts a grandchild and then waits; the 10 s limit is only the time to
    reach that wait."""
    pid_file = tmp_path / "grandchild.pid"
    code = ("import subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
            "print('waiting', flush=True)\n"
            "time.sleep(300)\n")
    status, out, tail = _suite_module()._run([sys.executable, "-c", code], {}, 10)
    assert status == "timeout" and "waiting" in out and tail.startswith("timed out after 10 s"), tail
    pid = int(pid_file.read_text())
    for _ in range(50):  # SIGKILL is sent at once; its delivery is not
        if not _alive(pid):
            break
        time.sleep(0.1)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for a parent that won't reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_spent_budget_still_writes_every_part(tmp_path):
    parts = suite(tmp_path, "--budget", "5")["parts"]
    assert [p for p, row in parts.items() if row["status"] != "not run"] == []
    assert "lora-8b" in parts and "full-3b" in parts and "vlm-qwen2" in parts


@pytest.mark.extended
def test_the_lora_part_compares_ftune_with_the_plain_script(tmp_path):
    variants = suite(tmp_path, "--parts", "lora-8b")["parts"]["lora-8b"]["result"]["variants"]
    row = variants["lora"]
    assert row["tokens_per_s"] > 0 and row["plain"]["tokens_per_s"] > 0 and row["ftune_over_plain"] > 0
    assert row["ftune_over_plain_measure"] == "steps/s"  # the same rows, batch and seed on both sides
    assert row["threads"] >= 1 and row["plan_peak_bytes"] > 0
    auto = variants["lora+auto"]  # the plan's micro-batch for the same rows a step, run by both sides
    picked = auto["plan_batch"]
    assert picked["per_device"] * picked["accumulation"] == 4 and picked["note"].startswith("batch: ")
    assert auto["plain"]["tokens_per_s"] > 0 and auto["ftune_over_plain_measure"] == "steps/s"
