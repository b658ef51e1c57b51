"""ftune vs a plain, hand-written HF Trainer script: same tiny model, data, seed and steps, one run.

Reports the ratio of training steps/s (goal >= 0.98: ftune adds no per-step overhead worth having) and
the total wall time of each including start-up (ftune's includes accelerate launch and validation).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import yaml

STEPS = 200
ROUNDS = 2  # alternating plain/ftune rounds; best of each (CPU timing noise is one-sided)
SEQ = 128
BATCH = 8

PLAIN = textwrap.dedent('''
    import json, sys, time
    from datasets import load_dataset
    from peft import LoraConfig, get_peft_model
    from transformers import (AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling, Trainer,
                              TrainingArguments, set_seed)
    model_dir, data_file, out, steps, seq, batch = sys.argv[1:7]
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.pad_token = tok.pad_token or tok.eos_token
    ds = load_dataset("json", data_files=data_file, split="train")
    ds = ds.map(lambda b: tok(b["text"], truncation=True, max_length=int(seq)), batched=True,
                remove_columns=ds.column_names)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    set_seed(0)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                             task_type="CAUSAL_LM"))
    args = TrainingArguments(output_dir=out, max_steps=int(steps), per_device_train_batch_size=int(batch),
                             learning_rate=1e-3, logging_steps=10, save_strategy="no", report_to="none",
                             use_cpu=True, seed=0, disable_tqdm=True, dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=ds, data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
    result = trainer.train()
    print(json.dumps(result.metrics))
''')


def _assets(folder: Path) -> tuple[Path, Path]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.conftest import corpus

    from ftune.tiny import build_tiny_llama, train_tokenizer

    model_dir = folder / "model"
    tok = train_tokenizer(corpus(), model_dir, vocab_size=512)
    build_tiny_llama(model_dir, tok, hidden_size=128, intermediate_size=256, num_layers=4)
    data = folder / "data.jsonl"
    lines = corpus(2000, seed=5)
    data.write_text("".join(json.dumps({"text": " ".join(lines[i:i + 4])}) + "\n" for i in range(0, 2000, 2)))
    return model_dir, data


def main() -> dict:
    folder = Path(tempfile.mkdtemp(prefix="ftune-bench-trainer-"))
    model_dir, data = _assets(folder)
    recipe = {
        "name": "bench-trainer",
        "model": {"path": str(model_dir), "dtype": "float32"},
        "data": {"train": [{"path": str(data), "format": "text"}], "max_seq_length": SEQ, "shuffle": False,
                 "train_on": "all"},
        "peft": {"method": "lora", "r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
        "train": {"max_steps": STEPS, "per_device_batch_size": BATCH, "learning_rate": 1e-3, "logging_steps": 10,
                  "seed": 0},
        "checkpoint": {"strategy": "no", "resume": False},
        "output": {"dir": str(folder / "run"), "report_to": ["none"], "loss_curve": False},
    }
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    script = folder / "plain.py"
    script.write_text(PLAIN)

    plain_sps, ftune_sps, plain_wall, ftune_wall = [], [], [], []
    for i in range(ROUNDS):
        t0 = time.perf_counter()
        plain = subprocess.run([sys.executable, str(script), str(model_dir), str(data), str(folder / "plain"),
                                str(STEPS), str(SEQ), str(BATCH)], capture_output=True, text=True, check=True)
        plain_wall.append(time.perf_counter() - t0)
        plain_sps.append(json.loads(plain.stdout.strip().splitlines()[-1])["train_steps_per_second"])

        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "ftune.cli.main", "run", str(path), f"output.dir={folder}/run{i}"],
                       capture_output=True, text=True, check=True)
        ftune_wall.append(time.perf_counter() - t0)
        records = [json.loads(x) for x in (folder / f"run{i}" / "metrics.jsonl").read_text().splitlines()]
        ftune_sps.append(next(r for r in records if "train_steps_per_second" in r)["train_steps_per_second"])
    plain_metrics = {"train_steps_per_second": max(plain_sps)}
    ftune_metrics = {"train_steps_per_second": max(ftune_sps)}
    plain_wall, ftune_wall = min(plain_wall), min(ftune_wall)

    ratio = ftune_metrics["train_steps_per_second"] / plain_metrics["train_steps_per_second"]
    result = {
        "steps": STEPS,
        "plain_steps_per_s": round(plain_metrics["train_steps_per_second"], 3),
        "ftune_steps_per_s": round(ftune_metrics["train_steps_per_second"], 3),
        "steps_per_s_ratio": round(ratio, 3),
        "plain_wall_s": round(plain_wall, 1),
        "ftune_wall_s": round(ftune_wall, 1),
    }
    print(f"trainer: ftune/plain steps/s = {ratio:.3f} (goal >= 0.98); wall incl. start-up: ftune "
          f"{ftune_wall:.1f} s vs plain {plain_wall:.1f} s")
    return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
