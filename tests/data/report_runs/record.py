"""Record the report's fixture runs: four small real runs through `ftune run` on the tiny model, their text files
copied here (no weights). Rerun after a change to what a run writes:

    .venv/bin/python tests/data/report_runs/record.py

finished: SFT + LoRA on instruction rows, eval every 10 steps, evaluation by generation (predictions.jsonl);
second: the same at another learning rate and rank (the two-run comparison); stopped: the same recipe stopped by
SIGTERM once its step-10 checkpoint is complete; rl: a short SFT then GRPO rewarded by exact_match, as
tests/e2e/test_rl.py does (completions.jsonl). `record.py rl` records only the named runs again.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
KEEP = ("ftune_run.json", "recipe.resolved.yaml", "recipe.origins.json", "plan.json", "env.json", "params.json",
        "metrics.jsonl", "summary.json", "predictions.jsonl", "completions.jsonl", "error.json")
WORK = Path(tempfile.gettempdir()) / "ftune-report-runs"


def ftune(*args: str, wait: bool = True):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HOME": str(WORK / "hf_home"), "FTUNE_CACHE": str(WORK / "cache"), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "ftune.cli.main", *args], cwd=WORK, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if wait:
        out, err = proc.communicate()
        assert proc.returncode == 0, out + err
    return proc


def recipe(name: str, model: Path, data: Path, **train) -> Path:
    r = {"schema_version": 1, "name": name, "description": "a fixture run of the report tests",
         "model": {"path": str(model), "dtype": "float32"},
         "data": {"train": [{"path": str(data), "format": "instruction", "template": "{instruction} ="}],
                  "eval": {"split": 0.1},
                  "max_seq_length": 64},
         "peft": {"method": "lora", "r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
         "train": {"max_steps": 30, "learning_rate": 5e-3, "per_device_batch_size": 8, "logging_steps": 2, "seed": 7,
                   "warmup_steps": 3, **train},
         "eval": {"strategy": "steps", "steps": 10, "generate": {"max_new_tokens": 4, "max_samples": 20}},
         "checkpoint": {"strategy": "steps", "steps": 10, "keep": 1},
         "output": {"dir": f"runs/{name}", "report_to": ["none"], "loss_curve": False}}
    path = WORK / f"{name}.yaml"
    path.write_text(yaml.safe_dump(r, sort_keys=False))
    return path


def main() -> None:
    sys.path.insert(0, str(HERE.parents[2]))
    from transformers import AutoTokenizer

    from ftune.tiny import build_tiny_llama, corpus, train_tokenizer

    only = sys.argv[1:]  # run names to record again (default: all four)
    if not only:
        shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(exist_ok=True)
    train_tokenizer(corpus() + ["### Instruction: ### Response:"], WORK / "tok", vocab_size=384)
    model = WORK / "tiny-llama"
    build_tiny_llama(model, AutoTokenizer.from_pretrained(WORK / "tok"))
    rng = random.Random(3)
    rows = []
    for _ in range(200):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append({"instruction": f"add {a} and {b}", "input": "", "output": f"{a + b}"})
    data = WORK / "add.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))

    names = only or ["finished", "second", "stopped", "rl"]
    if "finished" in names:
        ftune("run", str(recipe("finished", model, data)))
    if "second" in names:
        ftune("run", str(recipe("second", model, data)), "train.learning_rate=2e-3", "peft.r=4")
    if "stopped" in names:
        proc = ftune("run", str(recipe("stopped", model, data, max_steps=200)), wait=False)
        marker = WORK / "runs/stopped/checkpoints/checkpoint-10/ftune_complete.json"
        while not marker.is_file():
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate()
        assert proc.returncode == 143, out + err
    if "rl" in names:
        shutil.rmtree(WORK / "runs/rl", ignore_errors=True)
        record_rl(model, rng)
    copy([n for n in ("finished", "second", "stopped", "rl") if (WORK / "runs" / n).is_dir()])


def record_rl(model: Path, rng: random.Random) -> None:
    """tests/e2e/test_rl.py's setup, smaller: a short full SFT teaches `Q: ...\nA:` -> one of four words + eos, then
    GRPO rewards one of them (exact_match)."""
    from ftune.tiny import WORDS

    answers = ("cat", "dog", "sun", "rain")
    filler = [w for w in WORDS if w not in answers]

    def questions(n: int) -> list[str]:
        return [" ".join(rng.choice(filler) for _ in range(3)) for _ in range(n)]

    sft_data, prompts = WORK / "sft.jsonl", WORK / "prompts.jsonl"
    sft_data.write_text("".join(json.dumps({"instruction": q, "output": f" {rng.choice(answers)}"}) + "\n"
                                for q in questions(256)))
    prompts.write_text("".join(json.dumps({"prompt": f"Q: {q}\nA:", "answer": "sun"}) + "\n" for q in questions(128)))
    sft = {"schema_version": 1, "name": "rl-sft", "model": {"path": str(model), "dtype": "float32"},
           "data": {"train": [{"path": str(sft_data), "format": "instruction", "template": "Q: {instruction}\nA:"}],
                    "max_seq_length": 64},
           "peft": {"method": "full"},
           "train": {"max_steps": 40, "learning_rate": 3e-3, "per_device_batch_size": 16, "seed": 1,
                     "logging_steps": 10, "warmup_steps": 0},
           "checkpoint": {"strategy": "no"}, "output": {"dir": "runs/rl-sft", "report_to": ["none"],
                                                        "loss_curve": False}}
    (WORK / "rl-sft.yaml").write_text(yaml.safe_dump(sft, sort_keys=False))
    shutil.rmtree(WORK / "runs/rl-sft", ignore_errors=True)
    ftune("run", str(WORK / "rl-sft.yaml"))
    rl = {"schema_version": 1, "name": "rl", "model": {"path": str(WORK / "runs/rl-sft/final"), "dtype": "float32"},
          "data": {"train": [{"path": str(prompts), "format": "prompt"}]}, "peft": {"method": "full"},
          "train": {"objective": "grpo", "max_steps": 16, "logging_steps": 2, "learning_rate": 5e-3,
                    "lr_scheduler": "constant", "per_device_batch_size": 16, "seed": 3,
                    "rl": {"rewards": [{"name": "exact_match"}], "num_generations": 4, "max_completion_length": 4,
                           "beta": 0.04, "completions_sample": 4}},
          "checkpoint": {"strategy": "no"}, "output": {"dir": "runs/rl", "report_to": ["none"], "loss_curve": False}}
    (WORK / "rl.yaml").write_text(yaml.safe_dump(rl, sort_keys=False))
    ftune("run", str(WORK / "rl.yaml"))


def copy(names: list[str]) -> None:
    for name in names:
        src, dest = WORK / "runs" / name, HERE / name
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir()
        for f in KEEP:
            if (src / f).is_file():
                shutil.copy(src / f, dest / f)
        for marker in [src / "final/ftune_complete.json", *src.glob("checkpoints/*/ftune_complete.json")]:
            if marker.is_file():
                (dest / marker.parent.relative_to(src)).mkdir(parents=True, exist_ok=True)
                shutil.copy(marker, dest / marker.relative_to(src))
    print("recorded", ", ".join(p.name for p in sorted(HERE.iterdir()) if p.is_dir()))


if __name__ == "__main__":
    main()
