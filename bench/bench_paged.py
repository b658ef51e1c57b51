"""Paged generation (`train.rl.generation.backend: paged`, transformers' continuous batching) vs plain `generate` on
one padded batch (backend transformers): generated tokens per second of the same greedy work, in interleaved rounds.

Same work on both sides: the bench's tiny Llama (4 layers, hidden 128, random weights, float32), PROMPTS prompts
of 4-12 tokens, up to NEW greedy tokens each, one compute thread. The paged side runs `generate_batch` with the
cache the Plan gives TRL (`ftune.plan.paged`), the plain side TRL's regular path (left-padded `generate`). Both
must produce the same completions (checked every round). Figure: paged ÷ plain tokens/s per round (CPU time of
this process, which a loaded machine disturbs less than wall time), median and min-max, with the machine's load.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = int(os.environ.get("FTUNE_BENCH_PAGED_PROMPTS", 32))
NEW = int(os.environ.get("FTUNE_BENCH_PAGED_NEW", 48))
ROUNDS = int(os.environ.get("FTUNE_BENCH_PAGED_ROUNDS", 5))


def main() -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.generation import ContinuousBatchingConfig
    from transformers.utils import logging as hf_logging

    from ftune.plan.paged import generation_batch
    from ftune.recipe.schema import Recipe
    from ftune.tiny import WORDS, build_tiny_llama, corpus, train_tokenizer

    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    folder = Path(tempfile.mkdtemp(prefix="ftune-bench-paged-"))
    tok = train_tokenizer(corpus(), folder, vocab_size=512)
    build_tiny_llama(folder, tok, hidden_size=128, intermediate_size=256, num_layers=4)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = [tok(" ".join(WORDS[(5 * i + k) % len(WORDS)] for k in range(3 + i % 9)))["input_ids"]
               for i in range(PROMPTS)]
    recipe = Recipe.model_validate({
        "name": "bench-paged", "model": {"path": str(folder)},
        "data": {"train": [{"path": "p.jsonl", "format": "prompt"}], "max_prompt_length": max(map(len, prompts))},
        "train": {"objective": "grpo", "per_device_batch_size": PROMPTS,
                  "rl": {"rewards": [{"name": "exact_match"}], "num_generations": 4, "max_completion_length": NEW,
                         "generation": {"backend": "paged"}}}})
    cache = generation_batch(recipe).continuous_batching_config()
    config = GenerationConfig(max_new_tokens=NEW, do_sample=False, eos_token_id=tok.eos_token_id,
                              pad_token_id=tok.pad_token_id)
    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])

    def paged() -> list[list[int]]:
        out = model.generate_batch(prompts, generation_config=config, progress_bar=False,
                                   continuous_batching_config=ContinuousBatchingConfig(**cache))
        return [out[f"req_{i}"].generated_tokens for i in range(len(prompts))]

    def plain() -> list[list[int]]:
        rows = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, width:].tolist()
        return [r[:r.index(tok.eos_token_id) + 1] if tok.eos_token_id in r else r for r in rows]

    def timed(fn) -> tuple[float, list[list[int]]]:
        t0 = time.process_time()
        with torch.no_grad():
            done = fn()
        return sum(map(len, done)) / (time.process_time() - t0), done

    timed(paged), timed(plain)  # warm-up: first-call allocations, lazy imports
    ratios, rows, same = [], [], True
    for i in range(ROUNDS):
        if i % 2 == 0:
            (p, pc), (q, qc) = timed(paged), timed(plain)
        else:
            (q, qc), (p, pc) = timed(plain), timed(paged)
        same &= pc == qc
        ratios.append(p / q)
        rows.append({"first": "paged" if i % 2 == 0 else "plain", "paged_tokens_per_s": round(p, 1),
                     "plain_tokens_per_s": round(q, 1), "ratio": round(p / q, 3)})
        print(f"  round {i + 1}: {rows[-1]}", flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    result = {"prompts": PROMPTS, "max_new_tokens": NEW, "threads": 1, "cache": cache,
              "generated_tokens": sum(map(len, pc)), "same_completions": same, "rounds": rows,
              "paged_over_plain": {"median": round(statistics.median(ratios), 3), "min": round(min(ratios), 3),
                                   "max": round(max(ratios), 3)},
              "load_average_at_end": round(load, 1)}
    r = result["paged_over_plain"]
    print(f"paged: paged/plain generated tokens/s (CPU time) median {r['median']:.3f} (min {r['min']:.3f}, max "
          f"{r['max']:.3f}) over {ROUNDS} interleaved rounds; same greedy completions: {same}")
    return result


if __name__ == "__main__":
    main()
