"""`make bench-gpu`: ftune on one CUDA device — tokens/s, MFU, peak memory against `ftune plan`, and ftune
against a plain Trainer script with the same settings, with and without each lever.

The model is a Llama architecture built from a config (about 1B parameters, random init, bf16), so nothing
is downloaded. FLOPs per token (written down, as the MFU figure depends on it):
  full fine-tuning  6 N + 12 L s d   (forward 2N + backward 4N, plus attention scores and values)
  LoRA / QLoRA      4 N + 12 L s d   (no weight gradients for the frozen base: backward ≈ 2N)
with N the parameters, L layers, s the sequence length and d the hidden size. MFU = achieved FLOP/s ÷ the
device's dense bf16 peak (H100 SXM 989 TFLOP/s, H200 the same; override with FTUNE_PEAK_TFLOPS).

`plain` rows: every variant but `lora-wait` runs bench/plain_trainer.py too, a hand-written Trainer script with the
same settings (the same model, rows tokenized with BOS and EOS and cut to SEQ, pad-to-longest batches with labels
-100 on padding only, the same LoRA, bf16, gradient checkpointing, fused AdamW, batch, steps and seed) and the
variant's levers as transformers, peft, bitsandbytes and torchao offer them, with the values of ftune's Plan:
QLoRA a BitsAndBytesConfig 4-bit base through peft's prepare_model_for_kbit_training, Liger `use_liger_kernel`,
compile `torch_compile` with the Plan's backend, fp8 torchao's convert_to_float8_training on the layers ftune
converts, packing DataCollatorWithFlattening with the variant's attention (the rows flattened as they are, not
packed first: `compare` says what that changes). `ftune_over_plain` is the steps/s ratio where both sides' steps
hold the same tokens, the tokens/s ratio for packing; `ftune_over_plain_measure` says which.
`FTUNE_BENCH_PLAIN=each|after|0`: the plain run right after ftune's of each variant (default), after all of ftune's
(a part cut short keeps ftune's rows), or not at all.

`FTUNE_BENCH_VARIANTS=lora,full`: run only these variants (in that order). `FTUNE_BENCH_OUT=path`: the results
JSON is rewritten there after each variant, so a run cut short keeps what it measured. `FTUNE_BENCH_TIMEOUT`: seconds
one `ftune run` (or plain script) may take before it is recorded as timed out (default 600).
The packing variant uses flash_attention_2 where the flash_attn package imports, else sdpa (packed rows with
position_ids), and says which.

`FTUNE_BENCH_PROFILE=DIR`: both sides of every compared variant profile steps 6-8 with torch.profiler (ftune's worker
and the plain script load the same callback, ftune/worker/profile.py) into DIR/<variant>-{ftune,plain}/.

`lora-wait` (a variant, last by default): the LoRA run again at each OpenMP wait setting of the host threads
(`wait_rows`: passive, the runtime's default wait, active, and ftune's own choice from the load at launch), all at
the same thread count (the smoke runs two rows), each with FTUNE_BENCH_WAIT_TIMEOUT seconds (default 300) and the part with
FTUNE_BENCH_WAIT_BUDGET seconds in all (default 1200): rows that don't fit are recorded as not run (#42).

`FTUNE_BENCH_SHAPE=1b|3b|8b` picks the model's shape (TinyLlama ~1.1B, Llama-3.2-3B, Llama-3.1-8B; random init),
`FTUNE_BENCH_BATCH` the per-device batch (4), `FTUNE_BENCH_ASSETS=DIR` keeps each shape's model between runs.
`bench/gpu_suite.py` runs the parts a short GPU window holds, each time-limited (docs/performance.md).

`FTUNE_BENCH_SMOKE=1`: a tiny config, a few steps, on whatever device there is (variants that need CUDA are
skipped, MFU is not computed): checks this script end to end on a CPU machine. Its figures mean nothing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

SMOKE = os.environ.get("FTUNE_BENCH_SMOKE") == "1"
SEQ = int(os.environ.get("FTUNE_BENCH_SEQ", "64" if SMOKE else "2048"))
STEPS = int(os.environ.get("FTUNE_BENCH_STEPS", "3" if SMOKE else "30"))
BATCH = int(os.environ.get("FTUNE_BENCH_BATCH", "4"))
LR = 1e-4
PEAKS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
# `FTUNE_BENCH_SHAPE`: the model's shape, built from a config (random init, nothing downloaded)
SHAPES = {
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
               num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096),  # ~1.1B (TinyLlama)
    "3b": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
               num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072, tie_word_embeddings=True,
               rope_theta=500000.0),  # Llama-3.2-3B
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0),
}  # Llama-3.1-8B (the rope scaling aside: lengths here stay within what the plain rope handles)
SHAPE = os.environ.get("FTUNE_BENCH_SHAPE", "1b")
CONFIG = SHAPES[SHAPE]
ASSETS = os.environ.get("FTUNE_BENCH_ASSETS")
"""A folder that keeps each shape's model and corpus between runs (the GPU suite builds an 8B once for its parts)."""
if SMOKE:
    CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512, max_position_embeddings=256)
TIMEOUT = int(os.environ.get("FTUNE_BENCH_TIMEOUT", "600"))
OUT = os.environ.get("FTUNE_BENCH_OUT")
CUDA_ONLY = ("liger", "packing", "qlora", "compile", "fp8")  # variant names holding these need a CUDA device
LORA = {"method": "lora", "r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"}
VARIANTS = {
    "lora": {"peft": LORA},
    "lora+liger": {"peft": LORA, "train": {"kernels": "liger"}},
    "lora+packing+liger": {"peft": LORA, "train": {"kernels": "liger"}, "data": {"packing": True},
                           "model": {"attn_implementation": "flash_attention_2"
                                     if importlib.util.find_spec("flash_attn") else "sdpa"}},
    # the tiled loss in Liger's place (a machine without liger-kernel; its cost beside the plain script's loss)
    "lora+packing+tiled_loss": {"peft": LORA, "train": {"tiled_loss": True}, "data": {"packing": True},
                                "model": {"attn_implementation": "flash_attention_2"
                                          if importlib.util.find_spec("flash_attn") else "sdpa"}},
    "qlora": {"peft": LORA, "quantization": {"bits": 4, "compute_dtype": "bfloat16"}},
    "full": {"peft": {"method": "full"}},
    "full+compile": {"peft": {"method": "full"}, "train": {"compile": True}},
    "lora-wait": {"peft": LORA},  # the LoRA run at each of WAIT_ROWS (wait_comparison)
    # train.precision fp8 against its bf16 baseline with the same compile (gpu_suite's fp8-8b part)
    "lora+compile": {"peft": LORA, "train": {"compile": True}},
    "lora+fp8": {"peft": LORA, "train": {"compile": True, "precision": "fp8"}},
    # the plan picks the micro-batch and checkpointing for the same rows per step (docs/performance.md, "chosen by
    # the plan"); the plain script then runs what it picked
    "lora+auto": {"peft": LORA, "train": {"global_batch_size": BATCH, "per_device_batch_size": "auto",
                                          "gradient_checkpointing": "auto"}},
}
PLAIN = os.environ.get("FTUNE_BENCH_PLAIN", "each")
"""When the plain script runs: `each` right after ftune's run of a variant, `after` once every variant's ftune run
is done (a part cut short keeps ftune's rows), `0` never."""
PLAIN_SCRIPT = Path(__file__).resolve().parent / "plain_trainer.py"
WAIT_TIMEOUT = int(os.environ.get("FTUNE_BENCH_WAIT_TIMEOUT", "300"))
WAIT_BUDGET = int(os.environ.get("FTUNE_BENCH_WAIT_BUDGET", "1200"))


def wait_rows(cores: int) -> dict[str, dict[str, str]]:
    """The host threads' OpenMP settings compared (an OMP_NUM_THREADS in the environment keeps ftune's hands off
    the wait policy, `ftune.plan.threads`): all at the plan's thread count."""
    n = str(cores)
    rows = {"passive": {"OMP_NUM_THREADS": n, "OMP_WAIT_POLICY": "PASSIVE"},
            "runtime default": {"OMP_NUM_THREADS": n},
            "active": {"OMP_NUM_THREADS": n, "OMP_WAIT_POLICY": "ACTIVE"},
            "ftune default": {}}
    # the smoke checks the code path, not the figures: two rows (spinning rows on a loaded CPU take minutes)
    return {k: rows[k] for k in ("passive", "ftune default")} if SMOKE else rows


def wait_comparison(path: Path, run_dir: Path, variant: str) -> dict:
    """The same LoRA run at each wait setting, time-limited: steps/s and tokens/s per row, and each row's steps/s
    over the best row's; what ftune's own row chose (plan.json's cpu_threads)."""
    from ftune.plan.threads import physical_cores

    rows, started = {}, time.perf_counter()
    for name, settings in wait_rows(physical_cores()).items():
        left = WAIT_BUDGET - (time.perf_counter() - started)
        if left < 30:
            rows[name] = {"not_run": f"the part's {WAIT_BUDGET} s budget was spent"}
            continue
        env = {k: v for k, v in _env("ftune", variant).items() if not k.startswith(("OMP_", "GOMP_", "KMP_"))}
        out = run_dir / name.replace(" ", "-")
        try:
            run = subprocess.run([sys.executable, "-m", "ftune.cli.main", "run", str(path), f"output.dir={out}"],
                                 capture_output=True, text=True, timeout=min(WAIT_TIMEOUT, left), env=env | settings)
        except subprocess.TimeoutExpired:
            rows[name] = {"error": f"timed out after {min(WAIT_TIMEOUT, left):.0f} s"}
            continue
        if run.returncode != 0:
            rows[name] = {"error": run.stdout[-1000:] + run.stderr[-1000:]}
            continue
        records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
        summary = json.loads((out / "summary.json").read_text())
        threads = json.loads((out / "plan.json").read_text())["cpu_threads"] or {}
        rows[name] = {"steps_per_s": next((r["train_steps_per_second"] for r in reversed(records)
                                           if "train_steps_per_second" in r), None),
                      "tokens_per_s": round(summary["tokens_per_second"]),
                      "threads": threads.get("threads"), "wait_policy": threads.get("wait_policy"),
                      "wait_reason": threads.get("wait_reason")}
    done = {k: v["steps_per_s"] for k, v in rows.items() if v.get("steps_per_s")}
    for name, steps in done.items():
        rows[name]["over_best"] = round(steps / max(done.values()), 3)
    return {"rows": rows, "timeout_s": WAIT_TIMEOUT, "budget_s": WAIT_BUDGET}


def _assets(folder: Path) -> tuple[Path, Path]:
    """The model of SHAPE from a config and a skewed-length corpus (a few long rows, many short: what padding
    wastes); kept under FTUNE_BENCH_ASSETS/<shape> when that is set, and reused once complete."""
    import random

    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from ftune.tiny import train_tokenizer
    from ftune.tiny import corpus

    if ASSETS and not SMOKE:
        folder = Path(ASSETS) / SHAPE
        if (folder / "complete").is_file():
            return folder / "model", folder / "data.jsonl"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    model_dir = folder / "model"
    tok = train_tokenizer(corpus(2000), model_dir, vocab_size=CONFIG["vocab_size"])
    config = LlamaConfig(**CONFIG, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # random init of ~1B: much faster on a GPU
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(model_dir)
    del model
    rng = random.Random(0)
    words = " ".join(corpus(4000)).split()
    rows = [" ".join(rng.choices(words, k=int(rng.paretovariate(1.2) * 60))) for _ in range(4000)]
    data = folder / "data.jsonl"
    data.write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    (folder / "complete").write_text(SHAPE)
    return model_dir, data


def flops_per_token(n_params: int, full: bool) -> float:
    L, d = CONFIG["num_hidden_layers"], CONFIG["hidden_size"]
    return (6 if full else 4) * n_params + 12 * L * SEQ * d


def _env(side: str, variant: str) -> dict:
    """The environment of one side's run: FTUNE_BENCH_PROFILE=DIR profiles steps 6-8 into DIR/<variant>-<side>."""
    env = dict(os.environ)
    if os.environ.get("FTUNE_BENCH_PROFILE"):
        env["FTUNE_PROFILE"] = str(Path(os.environ["FTUNE_BENCH_PROFILE"]) / f"{variant}-{side}")
    return env


def plain_config(sections: dict, planned: dict) -> dict:
    """The plain script's levers for one variant, read from ftune's Plan of it (`ftune plan --format json`): what
    ftune's worker passes to from_pretrained and TrainingArguments, so a default the recipe leaves out (double
    quantization, compile's backend) is ftune's on both sides. LoRA's rank and alpha and fp8 from the recipe."""
    peft, load, trainer = sections["peft"], planned["model_load"]["kwargs"], planned["trainer"]
    bnb = load.get("quantization_config")
    return {"lora": {"r": peft["r"], "alpha": peft["alpha"]} if peft["method"] == "lora" else None,
            "quantization": {"quant_type": bnb["bnb_4bit_quant_type"], "double_quant": bnb["bnb_4bit_use_double_quant"],
                             "compute_dtype": bnb["bnb_4bit_compute_dtype"]} if bnb else None,
            "liger": bool(trainer.get("use_liger_kernel")), "packing": planned["collator"] != "padding",
            "attn_implementation": load.get("attn_implementation"),
            "compile_backend": trainer.get("torch_compile_backend") if trainer.get("torch_compile") else None,
            "fp8": sections.get("train", {}).get("precision") == "fp8",
            # the micro-batch and checkpointing as the plan decided them (the same as the recipe's, unless auto)
            "batch": trainer["per_device_train_batch_size"], "accumulation": trainer["gradient_accumulation_steps"],
            "checkpointing": bool(trainer.get("activation_checkpointing"))}


def plain(folder: Path, model_dir: Path, data: Path, levers: dict, variant: str) -> dict:
    """bench/plain_trainer.py on the same model, rows, batch and steps with `levers`: its tokens/s, steps/s, peak."""
    cfg = {"model": str(model_dir), "data": str(data), "out": str(folder / "plain"), "seq": SEQ, "batch": BATCH,
           "steps": STEPS, "lr": LR, "seed": 42, **levers}
    try:
        out = subprocess.run([sys.executable, str(PLAIN_SCRIPT), json.dumps(cfg)], capture_output=True, text=True,
                             timeout=TIMEOUT, env=_env("plain", variant))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {TIMEOUT} s"}
    if out.returncode != 0:
        return {"error": out.stderr[-1500:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(row: dict, folder: Path, model_dir: Path, data: Path, sections: dict, planned: dict | None,
            variant: str) -> None:
    """The plain script's run of `variant` into `row`, and `ftune_over_plain` with the measure it uses: steps/s when
    both sides' steps hold the same tokens (the same rows, batch and seed), tokens/s when they don't (packing,
    below)."""
    if planned is None:
        row["plain"] = {"not_run": "`ftune plan` failed, so the settings to copy are unknown"}
        return
    levers = plain_config(sections, planned)
    row["plain"] = base = plain(folder, model_dir, data, levers, variant)
    # Packing: ftune truncates rows to max_seq_length, packs them first-fit-decreasing into rows of max_seq_length
    # (each sample's first label -100), then per micro-batch flattens those packed rows into one [1, tokens] row
    # (`padding_free`, flash_attention_2) or stacks them padded to the widest with restarting position_ids (sdpa).
    # The plain script flattens the batch's rows as they are (DataCollatorWithFlattening, no packing), so its step
    # holds batch x the mean row (~220 tokens at seq 2048 on this corpus), ftune's about batch x max_seq_length:
    # the steps differ, and tokens/s compares what each way of dropping the padding delivers (ftune's from its
    # packed rows' mean, summary.json; the plain script's counted in its collator).
    ours, theirs, measure = ((row["tokens_per_s"], base.get("tokens_per_s"), "tokens/s") if levers["packing"]
                             else (row["steps_per_s"], base.get("steps_per_s"), "steps/s"))
    if ours and theirs:
        row["ftune_over_plain"] = round(ours / theirs, 3)
        row["ftune_over_plain_measure"] = measure


def main() -> dict:
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not SMOKE:
        print("bench-gpu: no CUDA device here; nothing measured (FTUNE_BENCH_SMOKE=1 checks the script on CPU)")
        return {}
    name = torch.cuda.get_device_name(0) if cuda else "cpu (smoke: figures mean nothing)"
    peak = float(os.environ.get("FTUNE_PEAK_TFLOPS", 0)) * 1e12 or next(
        (v for k, v in PEAKS.items() if k in name), 989e12)
    dtype = "bfloat16" if cuda else "float32"
    folder = Path(tempfile.mkdtemp(prefix="ftune-bench-gpu-"))
    model_dir, data = _assets(folder)
    if os.environ.get("FTUNE_BENCH_ASSETS_ONLY") == "1":  # the suite builds a shape's model once, then measures
        print(json.dumps({"model": str(model_dir), "data": str(data)}))
        return {}
    n_params = sum(p.numel() for p in __import__("transformers").AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.bfloat16).parameters())
    results = {"device": name, "shape": SHAPE if not SMOKE else "smoke", "params": n_params, "seq": SEQ,
               "batch": BATCH, "steps": STEPS, "variants": {}}
    chosen = [v.strip() for v in os.environ.get("FTUNE_BENCH_VARIANTS", "").split(",") if v.strip()] or list(VARIANTS)
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown:
        sys.exit(f"bench-gpu: unknown variant(s) {unknown}; known: {list(VARIANTS)}")
    if PLAIN not in ("each", "after", "0"):
        sys.exit(f"bench-gpu: FTUNE_BENCH_PLAIN={PLAIN!r}; one of each, after, 0")

    def save() -> None:  # after each run: a run cut short keeps what it measured
        if OUT:
            Path(OUT).write_text(json.dumps(results, indent=2))

    later = []  # FTUNE_BENCH_PLAIN=after: (row, sections, plan, variant) compared once every ftune run is done
    for variant in chosen:
        sections = VARIANTS[variant]
        save()
        if not cuda and any(k in variant for k in CUDA_ONLY) or (not cuda and "quantization" in sections):
            results["variants"][variant] = {"skipped": "needs a CUDA device"}
            continue
        recipe = {
            "name": f"gpu-{variant.replace('+', '-')}", "model": {"path": str(model_dir), "dtype": dtype, **sections.get("model", {})},
            # no shuffle in the data stage: the Trainer's sampler (same seed) then draws the same rows as the plain
            # script's, so both pad the same batches (on skewed lengths, another order is another workload)
            "data": {"train": [{"path": str(data)}], "max_seq_length": SEQ, "train_on": "all", "shuffle": False,
                     **sections.get("data", {})},
            "peft": sections["peft"],
            "train": {"max_steps": STEPS, "per_device_batch_size": BATCH, "learning_rate": LR, "logging_steps": 5,
                      "mixed_precision": "bf16" if cuda else "no", "gradient_checkpointing": True,
                      **sections.get("train", {})},
            "checkpoint": {"strategy": "no", "resume": False},
            "output": {"dir": str(folder / variant), "report_to": ["none"], "loss_curve": False},
        }
        if "quantization" in sections:
            recipe["quantization"] = sections["quantization"]
        path = folder / f"{variant}.yaml"
        path.write_text(yaml.safe_dump(recipe))
        if variant == "lora-wait":
            results["variants"][variant] = wait_comparison(path, folder / variant, variant)
            continue
        plan = subprocess.run([sys.executable, "-m", "ftune.cli.main", "plan", str(path), "--format", "json"],
                              capture_output=True, text=True)
        t0 = time.perf_counter()
        try:
            run = subprocess.run([sys.executable, "-m", "ftune.cli.main", "run", str(path)], capture_output=True,
                                 text=True, timeout=TIMEOUT, env=_env("ftune", variant))
        except subprocess.TimeoutExpired:
            results["variants"][variant] = {"error": f"timed out after {TIMEOUT} s"}
            continue
        if run.returncode != 0:
            results["variants"][variant] = {"error": run.stdout[-1500:] + run.stderr[-1500:]}
            continue
        summary = json.loads((folder / variant / "summary.json").read_text())
        tokens_per_s = summary["tokens_per_second"]
        full = sections["peft"]["method"] == "full"
        planned = json.loads(plan.stdout) if plan.returncode == 0 else None
        estimate = planned["estimate"] if planned else {}
        records = [json.loads(x) for x in (folder / variant / "metrics.jsonl").read_text().splitlines() if x]
        measured = summary.get("peak_memory_bytes")
        threads = json.loads((folder / variant / "plan.json").read_text()).get("cpu_threads") or {}
        row = {
            "tokens_per_s": round(tokens_per_s),
            "mfu": round(tokens_per_s * flops_per_token(n_params, full) / peak, 3) if cuda else None,
            # 6N per token whatever the method, as peers count it (LoRA's true count is the formula above)
            "mfu_6n": round(tokens_per_s * (6 * n_params + 12 * CONFIG["num_hidden_layers"] * SEQ
                                            * CONFIG["hidden_size"]) / peak, 3) if cuda else None,
            "threads": threads.get("threads"),
            "wait_policy": threads.get("wait_policy"),
            "peak_memory_bytes": measured,
            "plan_peak_bytes": estimate.get("total_bytes"),
            "plan_over_measured": round(estimate["total_bytes"] / measured, 3) if measured and estimate else None,
            "wall_s": round(time.perf_counter() - t0, 1),
            "steps_per_s": next((r["train_steps_per_second"] for r in reversed(records)
                                 if "train_steps_per_second" in r), None),
        }
        if variant == "lora+packing+liger":
            row["attn_implementation"] = sections["model"]["attn_implementation"]
        if planned and variant == "lora+auto":  # what the plan picked (as the plain side reads it), and why
            picked = plain_config(sections, planned)
            row["plan_batch"] = {"per_device": picked["batch"], "accumulation": picked["accumulation"],
                                 "checkpointing": picked["checkpointing"],
                                 "note": next((n for n in planned["notes"] if n.startswith("batch: ")), None)}
        results["variants"][variant] = row
        save()
        if PLAIN == "each":
            compare(row, folder, model_dir, data, sections, planned, variant)
        elif PLAIN == "after":
            later.append((row, sections, planned, variant))
    for row, sections, planned, variant in later:
        save()
        compare(row, folder, model_dir, data, sections, planned, variant)
    padded = results["variants"].get("lora", {}).get("plain", {}).get("tokens_per_s")
    packed = results["variants"].get("lora+packing+liger", {}).get("tokens_per_s")
    if padded and packed:  # the goal: >= 1.3x the plain padded Trainer on this skewed length distribution
        results["liger_packing_over_plain_padded"] = round(packed / padded, 3)
    shutil.rmtree(folder, ignore_errors=True)
    if OUT:
        Path(OUT).write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
