"""Step time of a LoRA step on a LLaVA with a frozen vision tower under activation checkpointing, with the tower
run without autograd (`ftune.worker.peft.without_autograd`, #40) and without it (as before: transformers hooks the
tower's patch embeddings to require grad, so backward ran through the frozen tower and recomputed its layers).

Two shapes, built from configs (random weights): `tiny` is the tests' LLaVA (28 px images, patch 14, one CLIP layer
of width 32, a 2-layer Llama of width 64); `tower` keeps that language model but gives the tower the share of the
compute it has in real VLMs (112 px, 64 patches per image, 2 CLIP layers of width 128). LoRA r 8 on every linear
layer of the language model, the projector trained whole (ftune's defaults), batch 8 images, fp32, gradient
checkpointing with ftune's kwargs (`use_reentrant: False`). A step is forward + backward + AdamW. Both models live
in one process and their steps are interleaved in rounds (A B A B ...), so the machine's swings fall on both alike;
the report is the median step time of each and their ratio per round. A step's time is its CPU time on one thread
(`--threads`): on a loaded machine the wall time swung by 4x between rounds.

    python bench/bench_vision_frozen.py [--rounds 5] [--steps 6] [--shape tiny|tower]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def build(shape: str, frozen_without_autograd: bool):
    import torch
    from transformers import AutoModelForImageTextToText, LlavaConfig

    from ftune.methods import lora
    from ftune.worker.peft import without_autograd

    image, vision, layers = (28, 32, 1) if shape == "tiny" else (112, 128, 2)
    torch.manual_seed(0)
    config = LlavaConfig(
        vision_config=dict(model_type="clip_vision_model", hidden_size=vision, num_hidden_layers=layers,
                           num_attention_heads=4, intermediate_size=4 * vision, image_size=image, patch_size=14,
                           projection_dim=vision),
        text_config=dict(model_type="llama", vocab_size=400, hidden_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                         max_position_embeddings=1024),
        image_token_id=399, vision_feature_select_strategy="default", vision_feature_layer=-1)
    model = AutoModelForImageTextToText.from_config(config)
    model = lora.inject(model, lora.Config(r=8, alpha=16, target_modules="all-linear"), "image-text-to-text")
    if frozen_without_autograd:
        without_autograd(model)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    tokens = (image // 14) ** 2
    ids = torch.cat([torch.full((8, tokens), 399), torch.randint(0, 390, (8, 24))], dim=1)
    batch = {"input_ids": ids, "pixel_values": torch.randn(8, 3, image, image), "labels": ids}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    return model, batch, opt


def step(model, batch, opt) -> float:
    """The step's CPU time (this process, every thread): on a shared machine it swings less than the wall time."""
    t0 = time.process_time()
    model(**batch).loss.backward()
    opt.step()
    opt.zero_grad()
    return time.process_time() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--shape", choices=("tiny", "tower"), default="tower")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the work, not the machine)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    runs = {"before": build(args.shape, False), "after": build(args.shape, True)}
    for model, batch, opt in runs.values():
        step(model, batch, opt)  # warm-up
    rounds = []
    for _ in range(args.rounds):
        times = {}
        for name, (model, batch, opt) in runs.items():
            times[name] = statistics.median(step(model, batch, opt) for _ in range(args.steps))
        rounds.append({**{k: round(v * 1000, 1) for k, v in times.items()},
                       "ratio": round(times["after"] / times["before"], 3)})
        print(json.dumps(rounds[-1]), flush=True)
    ratios = [r["ratio"] for r in rounds]
    print(json.dumps({"shape": args.shape, "threads": args.threads, "median_ratio": statistics.median(ratios), "min": min(ratios),
                      "max": max(ratios), "before_ms": statistics.median(r["before"] for r in rounds),
                      "after_ms": statistics.median(r["after"] for r in rounds)}))


if __name__ == "__main__":
    main()
