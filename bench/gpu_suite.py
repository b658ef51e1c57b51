"""The one prepared command for a short GPU window (15 minutes in all, the machine's start included): every GPU
measurement ftune still owes, most valuable first, each part time-limited, the results JSON rewritten after each
part so a cut run keeps what it measured, and `pytest -m gpu tests/gpu` last.

    python bench/gpu_suite.py [--budget 540] [--out bench/results/gpu-DATE.json] [--parts lora-8b,long-8b]

Parts, in order (seconds each may take; a part gets at most what is left of --budget):
  env        15   device, driver, torch/CUDA and package versions, cores
  assets-8b 100   a Llama-3.1-8B shape from its config (random init, bf16) and a skewed-length corpus, kept in
                  FTUNE_BENCH_ASSETS for the 8B parts (nothing is downloaded)
  lora-8b   170   LoRA r16 all-linear at seq 4096, batch 2, and LoRA with Liger + packing, each beside its plain
                  Trainer+peft script (padded; Liger and DataCollatorWithFlattening) (bench/gpu.py: tokens/s, MFU by
                  the LoRA formula and by 6N, peak vs plan, threads, ftune / plain); then `lora+auto`: the same 2
                  rows a step with the micro-batch and checkpointing the plan picks (no recompute if 2 rows fit)
  long-8b   150   `ftune plan`'s longest sequence for the 8B LoRA (Liger, or the tiled loss without liger-kernel;
                  checkpointing, batch 1) on this device, then 2 steps at 4096 packed and 1 at that length (ftune
                  only): peak vs plan at both; the plan's
                  longest with offloaded checkpoints and the tiled MLP too, and for full fine-tuning with FSDP2 CPU
                  offload and every lever, with the host memory it offloads (plan only)
  qlora-8b   60   QLoRA nf4 at seq 4096, beside the plain BitsAndBytesConfig + peft script
  grpo-1.5b 120   GRPO on a Qwen2.5-1.5B shape (8 generations, 256-token completions), LoRA and then full
                  fine-tuning: ftune vs plain TRL, generated tokens/s and the generation/training split, then ftune
                  with `train.rl.generation.backend: paged` beside TRL's continuous batching (bench/bench_grpo.py)
  full-3b    80   full fine-tuning of a Llama-3.2-3B shape, fused AdamW, beside the plain Trainer script
  gpu-tests  40   pytest -m gpu tests/gpu
  fp8-8b    150   `train.precision: fp8` (torchao float8, compiled) vs bf16 compiled, LoRA all-linear at seq 4096, batch
                  2: tokens/s of each and their ratio beside `ftune plan`'s fp8 estimate, then each one's plain
                  script (torch_compile; torchao's float8) with what is left; off an FP8 GPU (compute capability
                  < 8.9, or the CPU smoke) the plan's estimate and this device's refusal only
  vlm-qwen2 180   Qwen2-VL, which needs torchvision: installs a carried torchvision wheel that matches this torch
                  (FTUNE_BENCH_WHEELS, default wheels/), then a tiny Qwen2-VL learns the colour task, merges and
                  generates with images; a Qwen2.5-VL-3B shape's tokens/s and peak vs plan (bench/bench_vlm_qwen2.py).
                  Without a wheel: "skipped", why "no torchvision wheel"

`FTUNE_BENCH_SMOKE=1` runs the parts that can run on a CPU on a tiny model (the others are recorded as skipped),
so tests/unit/test_gpu_suite.py checks this script in `make test`; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SMOKE = os.environ.get("FTUNE_BENCH_SMOKE") == "1"


@dataclass(frozen=True)
class Part:
    name: str
    budget_s: int
    cuda_only: bool = False


# #36's parts first (they fill a 9-minute window); fp8 and the Qwen2-VL part after them: in a first window they
# run only when the others finish early, in a second one by name (`--parts fp8-8b,vlm-qwen2`)
PARTS = [Part("env", 15), Part("assets-8b", 100, cuda_only=True), Part("lora-8b", 170), Part("long-8b", 150),
         Part("qlora-8b", 60, cuda_only=True), Part("grpo-1.5b", 120, cuda_only=True),
         Part("full-3b", 80, cuda_only=True), Part("gpu-tests", 40, cuda_only=True), Part("fp8-8b", 150),
         Part("vlm-qwen2", 180)]
WHEELS = Path(os.environ.get("FTUNE_BENCH_WHEELS") or REPO / "wheels")
"""Where a GPU session carries wheels the machine can't download (a torchvision built for the device's torch)."""


def _run(argv: list[str], env: dict, timeout: float) -> tuple[str, str, str]:
    """(status: ok, error or timeout; stdout; the output's tail for the record). The command runs in its own
    session, and a timeout kills the whole group: an `ftune run` or plain script it started doesn't keep the GPU
    into the next part (`ftune run`'s launcher and workers die with it)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **env}, cwd=REPO, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # it ended as the time ran out
            pass
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # a process outside the group still holds the pipe: keep nothing
            out = ""
        return "timeout", out, f"timed out after {timeout:.0f} s\n{out[-2000:]}"
    return ("ok" if proc.returncode == 0 else "error"), out, out[-2000:] + err[-2000:]


def _gpu_bench(env: dict, timeout: float, assets: Path) -> tuple[str, dict, str]:
    """bench/gpu.py with `env`; its results file is rewritten after each variant, so a timeout keeps the rows done."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    status, _, tail = _run([sys.executable, str(REPO / "bench/gpu.py")],
                        {"FTUNE_BENCH_OUT": str(out), "FTUNE_BENCH_ASSETS": str(assets), **env}, timeout)
    try:
        result = json.loads(out.read_text() or "{}")
    except ValueError:
        result = {}
    out.unlink(missing_ok=True)
    return status, result, tail


def part_env() -> dict:
    import torch

    facts = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
             "cores": os.cpu_count(), "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}
    if torch.cuda.is_available():
        facts["device_memory_bytes"] = torch.cuda.get_device_properties(0).total_memory
    for name in ("transformers", "peft", "accelerate", "trl", "bitsandbytes", "liger_kernel", "flash_attn"):
        try:
            facts[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 - a missing optional package is a fact too
            facts[name] = None
    try:
        facts["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                         capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        facts["driver"] = None
    return facts


ALST_LEVERS = {"activation_offloading": True, "tiled_mlp": True}
"""What ftune has of ALST's levers beside Liger and checkpointing: offloaded checkpoints and the tiled MLP."""
FULL_ON_ONE_GPU = {"peft": {"method": "full"},
                   "distributed": {"strategy": "fsdp", "num_processes": 1, "fsdp": {"cpu_offload": True}}}
"""Full fine-tuning as ftune does ALST's on one GPU: FSDP2 with the parameters, gradients and AdamW's moments in
host memory, each decoder layer gathered onto the device in turn (docs/performance.md, "as ALST does it")."""


def longest(shape_env: dict, seq: int, assets: Path, memory: int | None, timeout: float,
            levers: dict | None = None, sections: dict | None = None) -> tuple[int | None, dict]:
    """`ftune plan`'s longest sequence for the long-context recipe (with `levers` added to its train section and
    `sections` replacing its own) on a device of `memory` bytes (None: this one), and the plan's estimate."""
    sys.path.insert(0, str(REPO / "bench"))
    import gpu  # noqa: E402 - the bench's recipe and assets

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model_dir, data = gpu._assets(assets)
    recipe = long_recipe(model_dir, data, seq, Path(tempfile.mkdtemp(prefix="ftune-long-")), levers, sections)
    argv = [sys.executable, "-m", "ftune.cli.main", "plan", str(recipe), "--format", "json"]
    if memory:  # this machine's RAM too: offloaded rows must fit it (the plan reads it itself without --gpu-memory)
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        argv += ["--gpu-memory", f"{memory // 2**20}MiB", "--host-memory", f"{ram // 2**20}MiB"]
    status, out, tail = _run(argv, shape_env, timeout)
    if status != "ok":
        return None, {"status": status, "tail": tail}
    plan = json.loads(out)
    return plan["estimate"].get("longest_seq"), plan["estimate"]


def loss_lever() -> dict:
    """How the long-context recipes keep the logits small: Liger's fused cross-entropy where liger-kernel is
    installed, else ftune's tiled loss (the same saving; a plan naming Liger would be refused without the package)."""
    import importlib.util

    return {"kernels": "liger"} if importlib.util.find_spec("liger_kernel") else {"tiled_loss": True}


def long_recipe(model_dir: Path, data: Path, seq: int, folder: Path, levers: dict | None = None,
                sections: dict | None = None) -> Path:
    import yaml

    recipe = {"name": f"long-{seq}", "model": {"path": str(model_dir), "dtype": "bfloat16"},
              "data": {"train": [{"path": str(data)}], "max_seq_length": seq, "train_on": "all", "packing": True},
              "peft": {"method": "lora", "r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"},
              "train": {"max_steps": 2, "per_device_batch_size": 1, "gradient_checkpointing": True,
                        "mixed_precision": "bf16", **loss_lever(), **(levers or {})},
              "checkpoint": {"strategy": "no", "resume": False},
              "output": {"dir": str(folder / "run"), "report_to": ["none"], "loss_curve": False},
              **(sections or {})}
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def run_part(part: Part, left: float, assets: Path, cuda: bool, facts: dict) -> dict:
    budget = min(part.budget_s * (3 if SMOKE else 1), left)  # a CPU smoke on a busy machine is slow, not wrong
    if part.cuda_only and not cuda:
        return {"status": "skipped", "why": "needs a CUDA device"}
    if part.name == "env":
        return {"status": "ok", "result": facts}
    if part.name == "assets-8b":
        status, result, tail = _gpu_bench({"FTUNE_BENCH_SHAPE": "8b", "FTUNE_BENCH_ASSETS_ONLY": "1"}, budget, assets)
        return {"status": status, "tail": tail if status != "ok" else None}
    if part.name == "lora-8b":
        env = {"FTUNE_BENCH_SHAPE": "8b", "FTUNE_BENCH_SEQ": "4096", "FTUNE_BENCH_BATCH": "2",
               "FTUNE_BENCH_STEPS": "12", "FTUNE_BENCH_VARIANTS": "lora,lora+packing+liger,lora+auto"}
        if SMOKE:
            env = {"FTUNE_BENCH_VARIANTS": "lora,lora+auto", "FTUNE_BENCH_STEPS": "2"}
        status, result, tail = _gpu_bench(env, budget, assets)
        return {"status": status, "result": result, "tail": tail if status != "ok" else None}
    if part.name == "long-8b":
        return long_context(budget, assets, cuda, facts)
    if part.name == "qlora-8b":
        status, result, tail = _gpu_bench({"FTUNE_BENCH_SHAPE": "8b", "FTUNE_BENCH_SEQ": "4096", "FTUNE_BENCH_BATCH": "2",
                                           "FTUNE_BENCH_STEPS": "8", "FTUNE_BENCH_VARIANTS": "qlora"}, budget, assets)
        return {"status": status, "result": result, "tail": tail if status != "ok" else None}
    if part.name == "fp8-8b":
        return fp8_part(budget, assets, cuda)
    if part.name == "full-3b":
        status, result, tail = _gpu_bench({"FTUNE_BENCH_SHAPE": "3b", "FTUNE_BENCH_SEQ": "4096", "FTUNE_BENCH_BATCH": "2",
                                           "FTUNE_BENCH_STEPS": "10", "FTUNE_BENCH_VARIANTS": "full"}, budget, assets)
        return {"status": status, "result": result, "tail": tail if status != "ok" else None}
    if part.name == "grpo-1.5b":
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = Path(f.name)
        status, _, tail = _run([sys.executable, str(REPO / "bench/bench_grpo.py")],
                            {"FTUNE_BENCH_GRPO_SHAPE": "qwen2.5-1.5b", "FTUNE_BENCH_GRPO_ROUNDS": "1",
                             "FTUNE_BENCH_GRPO_STEPS": "3", "FTUNE_BENCH_GRPO_COMPLETION": "256",
                             "FTUNE_BENCH_GRPO_GENERATIONS": "8", "FTUNE_BENCH_GRPO_BATCH": "32",
                             "FTUNE_BENCH_GRPO_METHODS": "lora,full", "FTUNE_BENCH_GRPO_OUT": str(out)}, budget)
        result = json.loads(out.read_text() or "{}") if out.exists() and out.stat().st_size else {}
        out.unlink(missing_ok=True)
        return {"status": status, "result": result, "tail": tail if status != "ok" else None}
    if part.name == "vlm-qwen2":
        return vlm_qwen2(budget)
    if part.name == "gpu-tests":
        status, _, tail = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
                             "tests/gpu"], {}, budget)
        return {"status": status, "tail": tail[-1500:]}
    raise ValueError(part.name)


def torchvision_for(torch_version: str) -> str:
    """The torchvision release built for a torch release: torch 2.N pairs with torchvision 0.(N+15)."""
    major, minor = (int(x) for x in torch_version.split("+")[0].split(".")[:2])
    return f"0.{minor + 15}" if major == 2 else "?"


def torchvision_works() -> str | None:
    """None when torchvision imports and runs a compiled op with this torch (a wheel for another torch or CUDA
    fails here: `operator torchvision::nms does not exist`); else the error's last line."""
    probe = "import torch, torchvision; torchvision.ops.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)"
    status, _, tail = _run([sys.executable, "-c", probe], {}, 120)
    return None if status == "ok" else (tail.strip().splitlines() or ["?"])[-1]


def torchvision_ready(wheels: Path) -> str | None:
    """None when torchvision works with this torch, after installing the carried wheel that matches it
    (`torchvision-0.(N+15)*.whl` in `wheels` for torch 2.N, `pip install --no-deps --no-index`); else why not, for
    the record (the part is skipped, not failed)."""
    import torch

    if torchvision_works() is None:
        return None
    want = torchvision_for(torch.__version__)
    found = sorted(wheels.glob("torchvision-*.whl")) if wheels.is_dir() else []
    if not found:
        return f"no torchvision wheel (none in {wheels}; torch {torch.__version__} needs torchvision {want})"
    match = [w for w in found if w.name.split("-")[1].split("+")[0].rsplit(".", 1)[0] == want]
    if not match:
        return (f"no torchvision wheel for torch {torch.__version__} (torchvision {want}) in {wheels}: found "
                f"{', '.join(w.name for w in found)}")
    status, _, tail = _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(match[-1])],
                           {}, 180)
    if status != "ok":
        return f"installing {match[-1].name} failed: {tail[-500:]}"
    failed = torchvision_works()
    return None if failed is None else f"{match[-1].name} is installed but fails with torch {torch.__version__}: {failed}"


def vlm_qwen2(budget: float) -> dict:
    """bench/bench_vlm_qwen2.py once torchvision works; skipped (why: no torchvision wheel ...) otherwise."""
    started = time.perf_counter()
    why = torchvision_ready(WHEELS)
    if why is not None:
        return {"status": "skipped", "why": why}
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    status, _, tail = _run([sys.executable, str(REPO / "bench/bench_vlm_qwen2.py")], {"FTUNE_BENCH_OUT": str(out)},
                           max(10.0, budget - (time.perf_counter() - started)))
    result = json.loads(out.read_text() or "{}") if out.exists() and out.stat().st_size else {}
    out.unlink(missing_ok=True)
    return {"status": status, "result": result, "tail": tail if status != "ok" else None}


def long_context(budget: float, assets: Path, cuda: bool, facts: dict) -> dict:
    """The plan's longest sequence on this device, then 2 steps there and at 4096: peak vs plan at both."""
    started = time.perf_counter()
    shape = {"FTUNE_BENCH_SHAPE": "8b"} if not SMOKE else {}
    memory = facts.get("device_memory_bytes") or (None if cuda else 80 * 2**30)
    os.environ.update(shape)
    seq_plan = 4096 if not SMOKE else 64
    length, estimate = longest(shape, seq_plan, assets, memory, budget)
    rows: dict = {"device_memory_bytes": memory, "plan_longest_seq": length, "loss_lever": loss_lever()}
    if length is None:
        return {"status": "error", "result": rows, "plan": estimate}
    rows["plan_notes"] = [n for n in estimate.get("notes", []) if n.startswith(("longest row", "longer rows"))]
    # with offloaded checkpoints and the tiled MLP: the plan's figure only (a million-token step takes minutes, and
    # its offloaded layer inputs take more host memory than a lent machine has)
    alst, alst_estimate = longest(shape, seq_plan, assets, memory, max(10.0, budget - (time.perf_counter() - started)),
                                  ALST_LEVERS)
    rows["plan_longest_seq_alst_levers"] = alst
    rows["plan_notes_alst_levers"] = [n for n in alst_estimate.get("notes", []) if n.startswith("longest row")]
    rows |= full_alst(shape, seq_plan, assets, memory, budget - (time.perf_counter() - started))
    lengths = [] if SMOKE else sorted({4096, length // 1024 * 1024})  # the smoke checks the plan's figure only
    for seq in lengths:
        left = budget - (time.perf_counter() - started)
        if left < 15:
            rows[str(seq)] = {"not_run": "the part's budget was spent"}
            continue
        # one step at the longest row: its peak is the figure (an 8B step at 128K tokens takes about a minute)
        env = {**shape, "FTUNE_BENCH_SEQ": str(seq), "FTUNE_BENCH_BATCH": "1",
               "FTUNE_BENCH_STEPS": "2" if seq <= 4096 else "1",
               "FTUNE_BENCH_VARIANTS": ("lora+packing+liger" if "kernels" in loss_lever() else
                                        "lora+packing+tiled_loss") if cuda else "lora", "FTUNE_BENCH_PLAIN": "0"}
        status, result, tail = _gpu_bench(env, left, assets)
        rows[str(seq)] = {"status": status, **next(iter(result.get("variants", {}).values()), {}),
                          **({"tail": tail} if status != "ok" else {})}
    return {"status": "ok", "result": rows}


def full_alst(shape: dict, seq: int, assets: Path, memory: int | None, left: float) -> dict:
    """The plan's longest row for full fine-tuning with every lever ftune has of ALST's, on one GPU (plan only), and
    the host memory it offloads: planned at `seq`, then again at that longest row (the offloaded checkpoints grow
    with the row; FSDP's offloaded states don't)."""
    started = time.perf_counter()
    length, estimate = longest(shape, seq, assets, memory, max(10.0, left), ALST_LEVERS, FULL_ON_ONE_GPU)
    rows = {"plan_longest_seq_full_alst_levers": length,
            "plan_notes_full_alst_levers": [n for n in estimate.get("notes", []) if n.startswith("longest row")],
            "plan_offloaded_bytes_full_alst_levers": {"seq": seq, "bytes": estimate.get("offloaded_bytes")}}
    if length is None:
        return rows | {"plan_full_alst_levers_failed": estimate}
    _, at_longest = longest(shape, length, assets, memory, max(10.0, left - (time.perf_counter() - started)),
                            ALST_LEVERS, FULL_ON_ONE_GPU)
    rows["plan_offloaded_bytes_full_alst_levers_at_longest"] = {"seq": length,
                                                                 "bytes": at_longest.get("offloaded_bytes")}
    return rows


def fp8_part(budget: float, assets: Path, cuda: bool) -> dict:
    """`ftune plan`'s fp8 estimate for the 8B LoRA recipe (as on an 80 GiB FP8 GPU), whether this device refuses
    it, and on an FP8 GPU the measured tokens/s of fp8 and bf16 (both compiled) and their ratio."""
    import yaml

    sys.path.insert(0, str(REPO / "bench"))
    import gpu  # noqa: E402 - the bench's recipe and assets

    started = time.perf_counter()
    shape = {"FTUNE_BENCH_SHAPE": "8b"} if not SMOKE else {}
    os.environ.update(shape)
    model_dir, data = gpu._assets(assets)
    seq = 4096 if not SMOKE else 64
    folder = Path(tempfile.mkdtemp(prefix="ftune-fp8-"))
    recipe = {"name": "fp8", "model": {"path": str(model_dir), "dtype": "bfloat16"},
              "data": {"train": [{"path": str(data)}], "max_seq_length": seq, "train_on": "all"},
              "peft": {"method": "lora", "r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"},
              "train": {"max_steps": 2, "per_device_batch_size": 2, "gradient_checkpointing": True,
                        "mixed_precision": "bf16", "compile": True, "precision": "fp8"},
              "checkpoint": {"strategy": "no", "resume": False},
              "output": {"dir": str(folder / "run"), "report_to": ["none"], "loss_curve": False}}
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    plan = [sys.executable, "-m", "ftune.cli.main", "plan", str(path)]
    status, out, tail = _run([*plan, "--format", "json", "--gpu-memory", "80GiB"], shape, budget)
    row: dict = {"plan_fp8": json.loads(out)["estimate"].get("fp8") if status == "ok" else {"status": status,
                                                                                          "tail": tail}}
    status, _, tail = _run(plan, shape, max(10.0, budget - (time.perf_counter() - started)))
    row["refused_here"] = None if status == "ok" else tail[-600:]
    if row["refused_here"] is not None or SMOKE:
        return {"status": "ok", "result": row}
    left = budget - (time.perf_counter() - started)
    status, result, tail = _gpu_bench({**shape, "FTUNE_BENCH_SEQ": str(seq), "FTUNE_BENCH_BATCH": "2",
                                       "FTUNE_BENCH_STEPS": "10", "FTUNE_BENCH_VARIANTS": "lora+compile,lora+fp8",
                                       "FTUNE_BENCH_PLAIN": "after"},
                                      left, assets)
    variants = result.get("variants", {})
    bf16, fp8 = (variants.get(v, {}).get("tokens_per_s") for v in ("lora+compile", "lora+fp8"))
    row |= {"variants": variants, "fp8_over_bf16": round(fp8 / bf16, 3) if bf16 and fp8 else None}
    return {"status": status, "result": row, "tail": tail if status != "ok" else None}


def main(argv: list[str] | None = None) -> dict:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=float(os.environ.get("FTUNE_GPU_BUDGET_S", 540)))
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / f"gpu-{time.strftime('%Y-%m-%d')}.json")
    parser.add_argument("--parts", default="", help="comma-separated part names (default: all, in order)")
    args = parser.parse_args(argv)
    chosen = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(chosen) - {p.name for p in PARTS})
    if unknown:
        parser.error(f"unknown part(s) {unknown}; the parts: {', '.join(p.name for p in PARTS)}")
    cuda = torch.cuda.is_available()
    # one scratch folder for everything the parts write (the 8B's weights, runs, recipes, result files), this
    # process's and its children's (TMPDIR), removed at the end: a second suite on the machine's disk finds it empty
    scratch = Path(tempfile.mkdtemp(prefix="ftune-gpu-suite-"))
    before = os.environ.get("TMPDIR")
    tempfile.tempdir, os.environ["TMPDIR"] = str(scratch), str(scratch)
    try:
        return _suite(args, chosen, cuda, Path(os.environ.get("FTUNE_BENCH_ASSETS") or scratch / "assets"))
    finally:
        tempfile.tempdir = None
        if before is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before
        shutil.rmtree(scratch, ignore_errors=True)


def _suite(args: argparse.Namespace, chosen: list[str], cuda: bool, assets: Path) -> dict:
    facts = part_env()
    results = {"date": time.strftime("%Y-%m-%d"), "smoke": SMOKE, "budget_s": args.budget, "parts": {}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for part in PARTS:
        if chosen and part.name not in chosen:
            continue
        left = args.budget - (time.perf_counter() - started)
        t0 = time.perf_counter()
        if left < 10:
            row = {"status": "not run", "why": f"the suite's {args.budget:.0f} s budget was spent"}
        else:
            row = run_part(part, left, assets, cuda, facts)
        row["seconds"] = round(time.perf_counter() - t0, 1)
        results["parts"][part.name] = row
        args.out.write_text(json.dumps(results, indent=2) + "\n")  # after each part: a cut run keeps what it has
        print(f"{part.name}: {row['status']} in {row['seconds']} s", flush=True)
    return results


if __name__ == "__main__":
    main()
