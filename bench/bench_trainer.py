"""ftune vs a plain, hand-written HF Trainer script doing the same work, in interleaved rounds.

Same work on both sides: the tiny Llama, the same rows (tokenized with BOS, EOS appended, truncated to SEQ),
the same collator semantics (pad to the longest row, labels -100 on padding only), fused AdamW (ftune's and
transformers' default), the same seed, steps and OMP_NUM_THREADS. The ratio is taken per round (ftune and
plain run back to back) and reported as median and min–max, so a 2% gap can be told from the load swings of
a shared 2-core machine.

Ablation: `plain+tokens` is the plain script with `include_num_input_tokens_seen="non_padding"` (a gather and
`.item()` every micro-batch: what ftune did before it took tokens/s from the data stage's counts); its ratio to
plain is that extra's cost. The callbacks' own cost is timed in-process (`callback_cost`).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import yaml

STEPS = 150
ROUNDS = 5
SEQ = 128
BATCH = 8
THREADS = "2"

PLAIN = textwrap.dedent('''
    import json, sys
    import torch
    from datasets import load_dataset
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments, set_seed
    model_dir, data_file, out, steps, seq, batch, count_tokens = sys.argv[1:8]
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.pad_token = tok.pad_token or tok.eos_token
    ds = load_dataset("json", data_files=data_file, split="train")

    def encode(b):  # as ftune's text format: BOS, EOS appended, truncated
        ids = [x + [tok.eos_token_id] if x[-1] != tok.eos_token_id else x for x in tok(b["text"])["input_ids"]]
        return {"input_ids": [x[: int(seq)] for x in ids]}

    ds = ds.map(encode, batched=True, remove_columns=ds.column_names)

    def collate(rows):  # pad to the longest row; labels -100 on padding only (EOS is trained)
        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), width), tok.pad_token_id)
        labels = torch.full((len(rows), width), -100)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            n = len(r["input_ids"])
            ids[i, :n] = labels[i, :n] = torch.tensor(r["input_ids"])
            mask[i, :n] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    set_seed(0)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                             task_type="CAUSAL_LM"))
    args = TrainingArguments(output_dir=out, max_steps=int(steps), per_device_train_batch_size=int(batch),
                             learning_rate=1e-3, logging_steps=10, save_strategy="no", report_to="none",
                             use_cpu=True, seed=0, data_seed=0, disable_tqdm=True, optim="adamw_torch_fused",
                             include_num_input_tokens_seen="non_padding" if count_tokens == "1" else "no")
    trainer = Trainer(model=model, args=args, train_dataset=ds, data_collator=collate)
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


def callback_cost(steps: int = 2000) -> dict:
    """Microseconds per training step that ftune's callbacks add (progress bar, metrics.jsonl every 10 steps),
    timed in-process on a fake step loop."""
    from rich.console import Console
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from ftune.worker.callbacks import make_callbacks

    from ftune.recipe.schema import Recipe
    from ftune.rundir import RunDir

    class _Plan:  # what make_callbacks reads: a real recipe and a run dir
        recipe = Recipe.model_validate({"name": "b", "model": {"path": "m"}, "data": {"train": [{"path": "d"}]},
                                        "train": {"max_steps": steps}})

        def __init__(self, root: Path) -> None:
            self.run = RunDir(root)

    with tempfile.TemporaryDirectory() as tmp:
        console = Console(file=open(os.devnull, "w"), force_terminal=True)  # noqa: SIM115
        cbs = make_callbacks(_Plan(Path(tmp)), console, tokens_per_step=1000.0)
        args = TrainingArguments(output_dir=tmp, use_cpu=True, report_to="none")
        state, control = TrainerState(max_steps=steps, is_world_process_zero=True), TrainerControl()
        for cb in cbs:
            cb.on_train_begin(args, state, control)
        t0 = time.perf_counter()
        for step in range(1, steps + 1):
            state.global_step = step
            for cb in cbs:
                cb.on_step_end(args, state, control)
                if step % 10 == 0:
                    cb.on_log(args, state, control, logs={"loss": 1.0, "learning_rate": 1e-3})
        per_step = (time.perf_counter() - t0) / steps
        for cb in cbs:
            cb.on_train_end(args, state, control)
    return {"callbacks_us_per_step": round(per_step * 1e6, 1)}


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
    env = dict(os.environ, OMP_NUM_THREADS=THREADS)

    def plain(count_tokens: bool) -> float:
        out = subprocess.run([sys.executable, str(script), str(model_dir), str(data), str(folder / "plain"),
                              str(STEPS), str(SEQ), str(BATCH), "1" if count_tokens else "0"],
                             capture_output=True, text=True, check=True, env=env)
        return json.loads(out.stdout.strip().splitlines()[-1])["train_steps_per_second"]

    def ftune(i: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "ftune.cli.main", "run", str(path), f"output.dir={folder}/run{i}"],
                       capture_output=True, text=True, check=True, env=env)
        wall = time.perf_counter() - t0
        records = [json.loads(x) for x in (folder / f"run{i}" / "metrics.jsonl").read_text().splitlines()]
        return next(r for r in records if "train_steps_per_second" in r)["train_steps_per_second"], wall

    ratios, token_ratios, rows = [], [], []
    for i in range(ROUNDS):  # interleaved: each ratio compares runs made seconds apart
        p = plain(False)
        f, wall = ftune(i)
        pt = plain(True)
        ratios.append(f / p)
        token_ratios.append(pt / p)
        rows.append({"plain": round(p, 3), "ftune": round(f, 3), "plain+tokens": round(pt, 3), "ftune_wall_s": round(wall, 1)})

    def spread(values: list[float]) -> dict:
        return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
                "max": round(max(values), 3)}

    result = {"steps": STEPS, "rounds": rows, "ftune_over_plain": spread(ratios),
              "token_counting_over_plain": spread(token_ratios), **callback_cost()}
    r, t = result["ftune_over_plain"], result["token_counting_over_plain"]
    print(f"trainer: ftune/plain steps/s median {r['median']:.3f} (min {r['min']:.3f}, max {r['max']:.3f}; "
          f"goal >= 0.98) over {ROUNDS} interleaved rounds")
    print(f"  ablation: plain with per-step token counting ÷ plain steps/s median {t['median']:.3f} "
          f"(min {t['min']:.3f}, max {t['max']:.3f}); ftune's callbacks {result['callbacks_us_per_step']} µs/step")
    return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
