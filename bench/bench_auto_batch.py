"""What the plan's step model for `per_device_batch_size: auto` / `gradient_checkpointing: auto` assumes, measured on
this CPU: checkpointing's cost at the same micro-batch, and a step's speed against the micro-batch at the same rows
per optimizer step (`ftune/estimate/autobatch.py`: full speed from 1,024 tokens a micro-batch on a CPU,
checkpointing x1.5 a step with a frozen base).

A Llama shape built from a config (random weights, fp32): hidden 256, MLP 896, 4 layers, a 512-token vocabulary
trained on ftune's tiny corpus; LoRA r 8 on every linear layer; packed rows of 256 tokens; 16 rows per optimizer
step (`train.global_batch_size: 16`) split by hand four ways, and `auto`. Each variant is one `ftune run` of
`--steps` steps; its figure is the Trainer's train_steps_per_second. Rounds alternate the variants' order.

    python bench/bench_auto_batch.py [--rounds 3] [--steps 12] [--out bench/results/cpu-auto-batch-DATE.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
SEQ, GLOBAL = 256, 16
VARIANTS = {  # name: the train keys beside global_batch_size
    "4x4 checkpointing": {"per_device_batch_size": 4, "gradient_checkpointing": True},
    "4x4": {"per_device_batch_size": 4, "gradient_checkpointing": False},
    "1x16": {"per_device_batch_size": 1, "gradient_checkpointing": False},
    "16x1": {"per_device_batch_size": 16, "gradient_checkpointing": False},
    "auto": {"per_device_batch_size": "auto", "gradient_checkpointing": "auto"},
}


def assets(folder: Path) -> tuple[Path, Path]:
    from transformers import AutoTokenizer

    from ftune.tiny import build_tiny_llama, corpus, train_tokenizer

    texts = corpus(4000, seed=3)
    train_tokenizer(texts, folder / "tok", vocab_size=512)
    build_tiny_llama(folder / "model", AutoTokenizer.from_pretrained(folder / "tok"), hidden_size=256,
                     intermediate_size=896, num_layers=4, num_heads=4, num_kv_heads=2, max_positions=1024)
    data = folder / "train.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return folder / "model", data


def run(folder: Path, model: Path, data: Path, name: str, steps: int) -> dict:
    out = folder / "runs" / f"{name.replace(' ', '-')}-{len(list((folder / 'runs').glob('*'))) if (folder / 'runs').exists() else 0}"
    recipe = {"name": "auto-bench", "model": {"path": str(model), "dtype": "float32"},
              "data": {"train": [{"path": str(data)}], "max_seq_length": SEQ, "packing": True, "train_on": "all"},
              "peft": {"method": "lora", "r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"},
              "train": {"max_steps": steps, "global_batch_size": GLOBAL, "logging_steps": steps, "seed": 0,
                        **VARIANTS[name]},
              "checkpoint": {"strategy": "no", "resume": False},
              "output": {"dir": str(out), "report_to": ["none"], "loss_curve": False}}
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    done = subprocess.run([sys.executable, "-m", "ftune.cli.main", "run", str(path)], capture_output=True, text=True,
                          cwd=folder, env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    if done.returncode != 0:
        raise SystemExit(f"{name}: ftune run failed\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    plan = json.loads((out / "plan.json").read_text())
    t = plan["trainer"]
    return {"steps_per_s": next(r["train_steps_per_second"] for r in reversed(records)
                                if "train_steps_per_second" in r),
            "loss": next((r["loss"] for r in records if "loss" in r), None),
            "micro_batch": t["per_device_train_batch_size"], "accumulation": t["gradient_accumulation_steps"],
            "checkpointing": bool(t.get("activation_checkpointing")),
            "note": next((n for n in plan["notes"] if n.startswith("batch: ")), None)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="ftune-bench-auto-"))
    model, data = assets(folder)
    names = list(VARIANTS)
    rows: dict[str, list[dict]] = {n: [] for n in names}
    for i in range(args.rounds):
        for name in names if i % 2 == 0 else reversed(names):
            rows[name].append(run(folder, model, data, name, args.steps))
            print(f"round {i + 1} {name}: {rows[name][-1]['steps_per_s']:.3f} steps/s", flush=True)
    base = "4x4 checkpointing"
    result = {"date": datetime.date.today().isoformat(), "cores": os.cpu_count(), "seq": SEQ,
              "global_batch_size": GLOBAL, "steps": args.steps, "rounds": args.rounds, "variants": {}}
    for name in names:
        ratios = [r["steps_per_s"] / b["steps_per_s"] for r, b in zip(rows[name], rows[base])]
        first = rows[name][0]
        result["variants"][name] = {
            "steps_per_s": [round(r["steps_per_s"], 4) for r in rows[name]],
            "over_4x4_checkpointing": round(statistics.median(ratios), 3),
            "spread": [round(min(ratios), 3), round(max(ratios), 3)],
            "micro_batch": first["micro_batch"], "accumulation": first["accumulation"],
            "checkpointing": first["checkpointing"], "first_loss": first["loss"], "note": first["note"]}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
