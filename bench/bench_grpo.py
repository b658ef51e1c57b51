"""GRPO: ftune vs a plain TRL GRPOTrainer script doing the same work, in interleaved rounds.

Same work on both sides: the bench's tiny Llama (4 layers, hidden 128, random weights), the same prompt rows, LoRA
r=8 on q/v, the same GRPOConfig settings (4 prompts x 4 completions a step, up to 16 tokens each, temperature 1,
beta 0, dapo loss, group scaling, fused AdamW at a constant 1e-3, seed 0, a log every step) and one reward: 1 when
the completion contains "the" (ftune's built-in `contains`; a two-line function in the plain script). The random
model rarely says its eos, so nearly every completion runs to 16 tokens on both sides and the work per step is
equal; ftune's guards, which stop a run whose completions are all clipped or whose rewards are all equal, are set
out of reach (`guard_logs`), as the plain script has none.

Figure: generated tokens per second of training (the sum over steps of TRL's `completions/mean_length` x 16
completions, over `train_runtime`), per round, ftune ÷ plain as median and min–max (goal >= 0.95). ftune's own
split of the step time (generation vs the rest, summary.json) is reported beside it. Rounds alternate which side
runs first.

One compute thread on both sides (`OMP_NUM_THREADS=1` in both environments). With 2 threads the plain script ran
about 53 s a step on the loaded 2-core machine and ftune far less: ftune sets `OMP_WAIT_POLICY=PASSIVE` for more
than one thread (docs/performance.md, "CPU threads"), the plain script got OpenMP's spinning wait, whose threads
stall each other at every barrier of the ~2,000 small ops a step's generation runs when the cores are taken. That
compared OpenMP settings, not the trainers; at one thread a step takes about 0.3-0.6 s there.

The plain script sets `bf16=False, activation_checkpointing=False`, as ftune's Plan does for this float32 recipe
(TRL's configs default to bf16 autocast and activation checkpointing), so both sides do the same arithmetic.

`FTUNE_BENCH_GRPO_METHODS=lora,full` (default `lora`): after the LoRA rounds, the same rounds with full fine-tuning
(`peft.method: full`; the plain script passes no peft_config) at a learning rate of 1e-5 on both sides, the scale
full fine-tuning uses (LoRA's 1e-3 on every weight could diverge, and a non-finite loss stops ftune's run, not the
plain one); reported under `full`. `FTUNE_BENCH_GRPO_OUT=path` is rewritten after each method's rounds, so a run cut
short keeps them.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import yaml

STEPS = int(os.environ.get("FTUNE_BENCH_GRPO_STEPS", 16))
ROUNDS = int(os.environ.get("FTUNE_BENCH_GRPO_ROUNDS", 5))
BATCH = int(os.environ.get("FTUNE_BENCH_GRPO_BATCH", 16))  # completions per step
GENERATIONS = int(os.environ.get("FTUNE_BENCH_GRPO_GENERATIONS", 4))
COMPLETION = int(os.environ.get("FTUNE_BENCH_GRPO_COMPLETION", 16))
THREADS = "1"  # both sides on a CPU (see the module doc); a GPU run leaves the threads to each side
# `tiny` (the CPU bench) or `qwen2.5-1.5b`: a Qwen2.5-1.5B shape from its config, random init, bf16 on the GPU, where
# completions run to max_completion_length (the GPU suite, bench/gpu_suite.py)
SHAPE = os.environ.get("FTUNE_BENCH_GRPO_SHAPE", "tiny")
QWEN_1_5B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True,
                 rope_theta=1000000.0)
OUT = os.environ.get("FTUNE_BENCH_GRPO_OUT")
METHODS = [m.strip() for m in os.environ.get("FTUNE_BENCH_GRPO_METHODS", "lora").split(",") if m.strip()]
LR = {"lora": 1e-3, "full": 1e-5}

PLAIN = textwrap.dedent('''
    import json, sys
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    model_dir, data_file, out, steps, batch, generations, completion = sys.argv[1:8]
    opts = json.loads(sys.argv[8]) if len(sys.argv) > 8 else {}
    cuda, paged = opts.get("cuda", False), opts.get("continuous_batching", False)
    full, lr = opts.get("method") == "full", opts.get("lr", 1e-3)
    tok = AutoTokenizer.from_pretrained(model_dir)
    ds = load_dataset("json", data_files=data_file, split="train")

    def contains(completions, **kwargs):
        return [float("the" in c.lower()) for c in completions]

    args = GRPOConfig(output_dir=out, max_steps=int(steps), per_device_train_batch_size=int(batch),
                      num_generations=int(generations), max_completion_length=int(completion), temperature=1.0,
                      top_p=1.0, beta=0.0, epsilon=0.2, num_iterations=1, loss_type="dapo", scale_rewards="group",
                      learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
                      optim="adamw_torch_fused", max_grad_norm=1.0, logging_steps=1, logging_first_step=True,
                      save_strategy="no", report_to="none", use_cpu=not cuda, seed=0, data_seed=0, disable_tqdm=True,
                      remove_unused_columns=False, log_completions=False, use_transformers_continuous_batching=paged,
                      bf16=cuda, activation_checkpointing=False)  # TRL's defaults are bf16 and checkpointing
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="bfloat16" if cuda else "float32")
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, reward_funcs=contains, args=args, train_dataset=ds, processing_class=tok,
                          peft_config=None if full else lora)
    result = trainer.train()
    tokens = sum(r["completions/mean_length"] * int(batch) for r in trainer.state.log_history
                 if "completions/mean_length" in r)
    print(json.dumps({"train_runtime": result.metrics["train_runtime"], "tokens": tokens}))
''')


def assets(folder: Path) -> tuple[Path, Path]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from ftune.tiny import WORDS, build_tiny_llama, corpus, train_tokenizer

    model_dir = folder / "model"
    if SHAPE == "qwen2.5-1.5b":
        import torch
        from transformers import AutoModelForCausalLM, Qwen2Config

        tok = train_tokenizer(corpus(), model_dir, vocab_size=4096)
        config = Qwen2Config(**QWEN_1_5B, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)
        with torch.device("cuda"):
            AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(model_dir)
    else:
        tok = train_tokenizer(corpus(), model_dir, vocab_size=512)
        build_tiny_llama(model_dir, tok, hidden_size=128, intermediate_size=256, num_layers=4)
    data = folder / "prompts.jsonl"
    rows = [{"prompt": f"Q: {WORDS[i % len(WORDS)]} {WORDS[(7 * i) % len(WORDS)]}\nA:", "answer": "the"}
            for i in range(256)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return model_dir, data


def recipe(model_dir: Path, data: Path, out: Path, backend: str = "transformers", method: str = "lora") -> dict:
    return {
        "name": "bench-grpo",
        "model": {"path": str(model_dir), "dtype": "bfloat16" if SHAPE != "tiny" else "float32"},
        "data": {"train": [{"path": str(data), "format": "prompt"}]},
        "peft": ({"method": "lora", "r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
                 if method == "lora" else {"method": "full"}),
        "train": {"objective": "grpo", "max_steps": STEPS, "per_device_batch_size": BATCH, "learning_rate": LR[method],
                  "lr_scheduler": "constant", "warmup_steps": 0, "logging_steps": 1, "seed": 0,
                  "mixed_precision": "bf16" if SHAPE != "tiny" else "no",
                  "rl": {"rewards": [{"name": "contains", "text": "the"}], "num_generations": GENERATIONS,
                         "max_completion_length": COMPLETION, "beta": 0.0, "guard_logs": 10 * STEPS,
                         "generation": {"backend": backend}}},
        "checkpoint": {"strategy": "no", "resume": False},
        "output": {"dir": str(out), "report_to": ["none"], "loss_curve": False},
    }


def main() -> dict:
    unknown = sorted(set(METHODS) - set(LR))
    if unknown:
        sys.exit(f"bench-grpo: unknown FTUNE_BENCH_GRPO_METHODS {unknown}; known: {list(LR)}")
    folder = Path(tempfile.mkdtemp(prefix="ftune-bench-grpo-"))
    model_dir, data = assets(folder)
    script = folder / "plain.py"
    script.write_text(PLAIN)
    gpu = SHAPE != "tiny"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env.update(TOKENIZERS_PARALLELISM="false", **({} if gpu else {"OMP_NUM_THREADS": THREADS}))

    def plain(method: str = "lora", continuous_batching: bool = False) -> float:
        opts = json.dumps({"cuda": gpu, "continuous_batching": continuous_batching, "method": method,
                           "lr": LR[method]})
        out = subprocess.run([sys.executable, str(script), str(model_dir), str(data), str(folder / "plain"),
                              str(STEPS), str(BATCH), str(GENERATIONS), str(COMPLETION), opts],
                             capture_output=True, text=True, check=True, env=env)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        return result["tokens"] / result["train_runtime"]

    def ftune(i: int, method: str = "lora", backend: str = "transformers") -> tuple[float, dict, float]:
        run = folder / f"run{i}-{method}-{backend}"
        path = folder / f"recipe{i}-{method}-{backend}.yaml"
        path.write_text(yaml.safe_dump(recipe(model_dir, data, run, backend, method)))
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "ftune.cli.main", "run", str(path)], capture_output=True, text=True,
                       check=True, env=env, cwd=folder)
        wall = time.perf_counter() - t0
        records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        tokens = sum(r["completion_length"] * BATCH for r in records if "completion_length" in r)
        runtime = next(r for r in records if "train_runtime" in r)["train_runtime"]
        return tokens / runtime, json.loads((run / "summary.json").read_text()), wall

    def rounds(method: str) -> dict:
        ratios, rows = [], []
        for i in range(ROUNDS):  # interleaved: each ratio compares runs made seconds apart; alternate who goes first
            if i % 2 == 0:
                p = plain(method)
                f, summary, wall = ftune(i, method)
            else:
                f, summary, wall = ftune(i, method)
                p = plain(method)
            ratios.append(f / p)
            share = summary["generation_seconds"] / (summary["generation_seconds"] + summary["training_seconds"])
            rows.append({"first": "plain" if i % 2 == 0 else "ftune", "ratio": round(f / p, 3),
                         "plain_tokens_per_s": round(p, 1), "ftune_tokens_per_s": round(f, 1),
                         "ftune_generation_share": round(share, 3), "ftune_wall_s": round(wall, 1)})
            print(f"  {method} round {i + 1}: {rows[-1]}", flush=True)
        r = spread(ratios)
        print(f"grpo {method}: ftune/plain generated tokens/s median {r['median']:.3f} (min {r['min']:.3f}, max "
              f"{r['max']:.3f}; goal >= 0.95) over {ROUNDS} interleaved rounds", flush=True)
        return {"rounds": rows, "ftune_over_plain": r}

    result: dict = {"shape": SHAPE, "steps": STEPS, "completions_per_step": BATCH, "generations": GENERATIONS,
                    "completion_tokens": COMPLETION, "threads": None if gpu else int(THREADS),
                    "plain_continuous_batching_tokens_per_s": None, "ftune_paged_tokens_per_s": None}

    def save() -> None:
        if OUT:
            Path(OUT).write_text(json.dumps(result, indent=2))

    for method in METHODS:
        block = {"learning_rate": LR[method], **rounds(method)}
        if method == "lora":  # LoRA's figures where they have always been
            result |= block
        else:
            result[method] = block
        save()
    if gpu:  # TRL's transformers continuous batching (LoRA): the plain script's flag, and ftune's `backend: paged`
        try:
            result["plain_continuous_batching_tokens_per_s"] = round(plain(continuous_batching=True), 1)
        except subprocess.CalledProcessError as err:
            result["plain_continuous_batching_tokens_per_s"] = {"error": err.stderr[-1500:]}
        save()
        try:
            result["ftune_paged_tokens_per_s"] = round(ftune(ROUNDS, backend="paged")[0], 1)
        except subprocess.CalledProcessError as err:
            result["ftune_paged_tokens_per_s"] = {"error": (err.stdout or "")[-1000:] + (err.stderr or "")[-1000:]}
    shutil.rmtree(folder, ignore_errors=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    result["load_average_at_end"] = round(load, 1)
    save()
    return result


def spread(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


if __name__ == "__main__":
    main()
