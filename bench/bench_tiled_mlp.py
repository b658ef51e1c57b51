"""Peak memory and time of one training step with and without ALST's tiling levers, the tiled MLP
(`train.tiled_mlp`) and the tiled loss (`train.tiled_loss`), measured on CPU, beside `ftune plan`'s estimate of the
same step.

A Llama shape built from a config (random weights, fp32): hidden 256, MLP 896 (the 8B's 3.5x ratio), 4 layers, a
vocabulary of `--vocab` words (Llama-3-8B's is 31x its hidden size: `--vocab 8000` here), one row of `--seq`
tokens, LoRA r 8 on every linear layer (ftune's inject), gradient checkpointing with ftune's kwargs, each lever in
its `auto` slices (the MLP: tokens / hidden; the loss: vocabulary / hidden). Each variant runs in its own process:
the model and
batch are built, the kernel's peak-RSS mark is reset (`/proc/self/clear_refs`), one forward + backward runs, and
the step's peak is VmHWM minus the RSS before it (glibc's mmap threshold fixed, `MALLOC`, so RSS follows the
live tensors). The plan's figure for the same recipe is its backward phase
(activations and temporaries: what a step adds on top of the resident weights). Rounds alternate the variants.

    python bench/bench_tiled_mlp.py [--seq 16384] [--rounds 3] [--vocab 512] [--variants plain,tiled]

Variants: `plain`, `tiled` (the MLP), `tiled_loss`, `both`. The step's seconds are recorded too (one thread).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
"""glibc serves blocks up to its mmap threshold from the heap, and raises that threshold to 32 MiB after the first
large free: freed tensors then stay in the process's RSS and the peak measures the allocator, not the tensors.
A fixed 64 KiB threshold maps every tensor of note on its own and unmaps it when freed."""
CONFIG = dict(vocab_size=512, hidden_size=256, intermediate_size=896, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=65536)


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


VARIANTS = {"plain": (False, False), "tiled": (True, False), "tiled_loss": (False, True), "both": (True, True)}
"""name -> (train.tiled_mlp, train.tiled_loss)."""


def recipe(folder: Path, seq: int, tiled: bool, tiled_loss: bool = False):
    from ftune.recipe.schema import Recipe

    return Recipe.model_validate({
        "name": "tile", "model": {"path": str(folder), "dtype": "float32"},
        "data": {"train": [{"path": "d.jsonl"}], "max_seq_length": seq},
        "peft": {"method": "lora", "r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"},
        "train": {"per_device_batch_size": 1, "gradient_checkpointing": True, "tiled_mlp": tiled,
                  "tiled_loss": tiled_loss}})


def child(folder: Path, seq: int, tiled: bool, tiled_loss: bool) -> dict:
    import gc
    import time

    import torch
    from transformers import AutoModelForCausalLM

    from ftune.methods import method_module
    from ftune.plan import tiling
    from ftune import tiled_loss as loss_tiling
    from ftune import tiled_mlp

    torch.set_num_threads(1)
    r = recipe(folder, seq, tiled, tiled_loss)
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa")
    model = method_module("lora").inject(model, r.peft, "causal-lm")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    if tiled:
        tiled_mlp.apply(tiling.mlps(model), "auto")
    if tiled_loss:
        loss_tiling.apply(model, "auto")
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (1, seq), generator=torch.Generator().manual_seed(0))
    gc.collect()
    before = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the peak-RSS mark starts again from the current RSS
    started = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    seconds = time.perf_counter() - started
    peak = _status("VmHWM")
    return {"step_peak_bytes": peak - before, "loss": float(loss), "seconds": seconds}


def planned(folder: Path, seq: int, tiled: bool, tiled_loss: bool = False) -> int:
    from ftune.estimate.estimate import estimate

    est = estimate(recipe(folder, seq, tiled, tiled_loss), world_size=1, num_processes=1, gpu_memory=None,
                   device="cpu")
    return sum(i.bytes for i in est.memory if i.phase == "backward")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=CONFIG["vocab_size"])
    ap.add_argument("--variants", default="plain,tiled", help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(Path(args.child[0]), int(args.child[1]), args.child[2] == "1", args.child[3] == "1")))
        return 0
    names = [v for v in args.variants.split(",") if v]
    if not names or set(names) - set(VARIANTS) or "plain" not in names:
        ap.error(f"--variants: plain and any of {', '.join(VARIANTS)}")
    config = {**CONFIG, "vocab_size": args.vocab}
    from transformers import AutoModelForCausalLM, LlamaConfig

    sys.path.insert(0, str(REPO))
    from ftune.tiny import corpus, train_tokenizer

    folder = Path(tempfile.mkdtemp(prefix="ftune-tile-")) / "model"
    train_tokenizer(corpus(200), folder, vocab_size=min(args.vocab, 512))  # the model's rows: config's vocab
    AutoModelForCausalLM.from_config(LlamaConfig(**config)).save_pretrained(folder)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for _ in range(args.rounds):
        for name in runs:
            mlp, loss = VARIANTS[name]
            out = subprocess.run([sys.executable, __file__, "--child", str(folder), str(args.seq), str(int(mlp)),
                                  str(int(loss))], capture_output=True, text=True, check=True,
                                 env={**os.environ, **MALLOC})
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    result = {"seq": args.seq, "config": config, "rounds": args.rounds}
    for name, rows in runs.items():
        peaks = [r["step_peak_bytes"] for r in rows]
        plan = planned(folder, args.seq, *VARIANTS[name])
        result[name] = {"step_peak_mib": [round(p / 2**20, 1) for p in peaks], "loss": rows[0]["loss"],
                        "seconds": [round(r["seconds"], 2) for r in rows],
                        "plan_backward_mib": round(plan / 2**20, 1),
                        "plan_over_measured": round(plan / statistics.median(peaks), 3)}
    for name in (n for n in names if n != "plain"):
        result[f"{name}_over_plain_measured"] = round(statistics.median(result[name]["step_peak_mib"])
                                                      / statistics.median(result["plain"]["step_peak_mib"]), 3)
        result[f"{name}_over_plain_plan"] = round(result[name]["plan_backward_mib"]
                                                  / result["plain"]["plan_backward_mib"], 3)
        result[f"{name}_over_plain_seconds"] = round(statistics.median(result[name]["seconds"])
                                                     / statistics.median(result["plain"]["seconds"]), 3)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
