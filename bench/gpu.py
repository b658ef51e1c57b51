"""`make bench-gpu`: ftune on one CUDA device — tokens/s, MFU, peak memory against `ftune plan`, and ftune
against a plain Trainer script with the same settings, with and without each lever.

The model is a Llama architecture built from a config (about 1B parameters, random init, bf16), so nothing
is downloaded. FLOPs per token (written down, as the MFU figure depends on it):
  full fine-tuning  6 N + 12 L s d   (forward 2N + backward 4N, plus attention scores and values)
  LoRA / QLoRA      4 N + 12 L s d   (no weight gradients for the frozen base: backward ≈ 2N)
with N the parameters, L layers, s the sequence length and d the hidden size. MFU = achieved FLOP/s ÷ the
device's dense bf16 peak (H100 SXM 989 TFLOP/s, H200 the same; override with FTUNE_PEAK_TFLOPS).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

SEQ = int(os.environ.get("FTUNE_BENCH_SEQ", "2048"))
STEPS = int(os.environ.get("FTUNE_BENCH_STEPS", "30"))
PEAKS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
CONFIG = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
              num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096)  # ~1.1B (TinyLlama shape)
VARIANTS = {
    "lora": {"peft": {"method": "lora", "r": 16, "alpha": 32, "target_modules": "all-linear"}},
    "lora+liger": {"peft": {"method": "lora", "r": 16, "alpha": 32, "target_modules": "all-linear"},
                   "train": {"kernels": "liger"}},
    "lora+packing+liger": {"peft": {"method": "lora", "r": 16, "alpha": 32, "target_modules": "all-linear"},
                           "train": {"kernels": "liger"}, "data": {"packing": True},
                           "model": {"attn_implementation": "flash_attention_2"}},
    "qlora": {"peft": {"method": "lora", "r": 16, "alpha": 32, "target_modules": "all-linear"},
              "quantization": {"bits": 4, "compute_dtype": "bfloat16"}},
    "full": {"peft": {"method": "full"}},
    "full+compile": {"peft": {"method": "full"}, "train": {"compile": True}},
}


def _assets(folder: Path) -> tuple[Path, Path]:
    """The ~1B model from a config and a skewed-length corpus (a few long rows, many short: what padding wastes)."""
    import random

    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from ftune.tiny import train_tokenizer
    from tests.conftest import corpus

    model_dir = folder / "model"
    tok = train_tokenizer(corpus(2000), model_dir, vocab_size=CONFIG["vocab_size"])
    config = LlamaConfig(**CONFIG, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(model_dir)
    rng = random.Random(0)
    words = " ".join(corpus(4000)).split()
    rows = [" ".join(rng.choices(words, k=int(rng.paretovariate(1.2) * 60))) for _ in range(4000)]
    data = folder / "data.jsonl"
    data.write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    return model_dir, data


def flops_per_token(n_params: int, full: bool) -> float:
    L, d = CONFIG["num_hidden_layers"], CONFIG["hidden_size"]
    return (6 if full else 4) * n_params + 12 * L * SEQ * d


def main() -> dict:
    import torch

    if not torch.cuda.is_available():
        print("bench-gpu: no CUDA device here; nothing measured")
        return {}
    name = torch.cuda.get_device_name(0)
    peak = float(os.environ.get("FTUNE_PEAK_TFLOPS", 0)) * 1e12 or next(
        (v for k, v in PEAKS.items() if k in name), 989e12)
    folder = Path(tempfile.mkdtemp(prefix="ftune-bench-gpu-"))
    model_dir, data = _assets(folder)
    n_params = sum(p.numel() for p in __import__("transformers").AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.bfloat16).parameters())
    results = {"device": name, "params": n_params, "seq": SEQ, "steps": STEPS, "variants": {}}
    for variant, sections in VARIANTS.items():
        recipe = {
            "name": f"gpu-{variant}", "model": {"path": str(model_dir), "dtype": "bfloat16",
                                                 **sections.get("model", {})},
            "data": {"train": [{"path": str(data)}], "max_seq_length": SEQ, "train_on": "all",
                     **sections.get("data", {})},
            "peft": sections["peft"],
            "train": {"max_steps": STEPS, "per_device_batch_size": 4, "learning_rate": 1e-4, "logging_steps": 5,
                      "mixed_precision": "bf16", "gradient_checkpointing": True, **sections.get("train", {})},
            "checkpoint": {"strategy": "no", "resume": False},
            "output": {"dir": str(folder / variant), "report_to": ["none"], "loss_curve": False},
        }
        if "quantization" in sections:
            recipe["quantization"] = sections["quantization"]
        path = folder / f"{variant}.yaml"
        path.write_text(yaml.safe_dump(recipe))
        plan = subprocess.run([sys.executable, "-m", "ftune.cli.main", "plan", str(path), "--format", "json"],
                              capture_output=True, text=True)
        t0 = time.perf_counter()
        run = subprocess.run([sys.executable, "-m", "ftune.cli.main", "run", str(path)], capture_output=True,
                             text=True)
        if run.returncode != 0:
            results["variants"][variant] = {"error": run.stdout[-1500:] + run.stderr[-1500:]}
            continue
        metrics = [json.loads(x) for x in (folder / variant / "metrics.jsonl").read_text().splitlines()]
        final = next(r for r in metrics if "train_steps_per_second" in r)
        summary = json.loads((folder / variant / "summary.json").read_text())
        tokens_per_s = summary["tokens_per_second"] or final["train_steps_per_second"] * 4 * SEQ
        full = sections["peft"]["method"] == "full"
        estimate = json.loads(plan.stdout)["estimate"] if plan.returncode == 0 else {}
        measured = summary.get("peak_memory_bytes")
        results["variants"][variant] = {
            "tokens_per_s": round(tokens_per_s),
            "mfu": round(tokens_per_s * flops_per_token(n_params, full) / peak, 3),
            "peak_memory_bytes": measured,
            "plan_peak_bytes": estimate.get("total_bytes"),
            "plan_over_measured": round(estimate["total_bytes"] / measured, 3) if measured and estimate else None,
            "wall_s": round(time.perf_counter() - t0, 1),
        }
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
