"""What eval.benchmarks at start and end adds to a run: the same tiny LoRA run with and without them, interleaved
rounds, each `ftune run` timed whole; the added wall time is compared with the harness's own seconds (the
`bench_seconds` of the two measurements, as metrics.jsonl records them).

    .venv/bin/python bench/bench_benchmarks.py [ROUNDS]

Offline: the tiny model is built from a config, the task is the project's own (tests/data/benchmarks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
TASKS = REPO / "tests" / "data" / "benchmarks"


def main(rounds: int = 2) -> None:
    work = Path(tempfile.mkdtemp(prefix="ftune-bench-benchmarks-"))
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                      HF_HOME=str(work / "hf"), FTUNE_CACHE=str(work / "cache"))
    from transformers import AutoTokenizer

    from ftune.tiny import build_tiny_llama, corpus, train_tokenizer

    train_tokenizer(corpus() + ["User: Assistant:"], work / "tok", vocab_size=384)
    build_tiny_llama(work / "model", AutoTokenizer.from_pretrained(work / "tok"))
    (work / "tasks").mkdir()
    for f in TASKS.glob("*.yaml"):
        (work / "tasks" / f.name).write_text(f.read_text().replace("tests/data/benchmarks/colors.jsonl",
                                                                   str(TASKS / "colors.jsonl")))
    rows = [json.loads(x) for x in (TASKS / "colors.jsonl").read_text().splitlines()]
    (work / "train.jsonl").write_text("".join(json.dumps({"text": f"{r['question']} {r['target']}."}) + "\n"
                                              for r in rows))
    base = {"schema_version": 1, "name": "cost", "model": {"path": str(work / "model"), "dtype": "float32"},
            "data": {"train": [{"path": str(work / "train.jsonl"), "format": "text"}], "max_seq_length": 64},
            "peft": {"method": "lora", "r": 8, "target_modules": ["q_proj", "v_proj"]},
            "train": {"max_steps": 30, "learning_rate": 3e-2, "per_device_batch_size": 8, "seed": 7},
            "checkpoint": {"strategy": "no"}, "output": {"loss_curve": False, "report_to": []}}
    bench = {"tasks": ["ftune_colors_mc"], "include": [str(work / "tasks")], "limit": 40, "at": ["start", "end"]}
    results: dict[str, list] = {"without": [], "with": []}
    for i in range(rounds):
        for label in ("without", "with"):
            recipe = {**base, "output": {**base["output"], "dir": str(work / f"runs/{label}-{i}")}}
            if label == "with":
                recipe["eval"] = {"benchmarks": bench}
            path = work / f"{label}-{i}.yaml"
            path.write_text(yaml.safe_dump(recipe))
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "ftune.cli.main", "run", str(path)], capture_output=True,
                                  text=True, cwd=work)
            seconds = time.perf_counter() - start
            assert proc.returncode == 0, proc.stdout + proc.stderr
            metrics = [json.loads(x) for x in (work / f"runs/{label}-{i}/metrics.jsonl").read_text().splitlines()]
            own = sum(m.get("bench_seconds", 0.0) for m in metrics)
            results[label].append((seconds, own))
            print(f"round {i} {label:8s} run {seconds:6.1f}s  harness {own:5.1f}s", flush=True)
    for i in range(rounds):
        (w, _), (b, own) = results["without"][i], results["with"][i]
        print(f"round {i}: added {b - w:+.1f}s, the two measurements' own time {own:.1f}s, ratio {(b - w) / own:.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
