"""The GPU suite's `vlm-qwen2` part (bench/gpu_suite.py; needs torchvision, which the suite installs from a carried
wheel): Qwen2-VL through ftune on a GPU machine.

1. a tiny Qwen2-VL built from a config (`ftune.tiny_vision.build_tiny_qwen2_vl`) learns the colour task of
   tests/vision_data.py through `ftune run` (LoRA, the projector trained whole; held-out exact match from
   `eval.generate`), then `ftune merge` (its logit check on image rows), then `ftune generate --image` on the
   merged folder names the colour of a red, a green and a blue square;
2. (CUDA only) a Qwen2.5-VL-3B shape built from its config (random init, bf16), LoRA r16 on the language model's
   linear layers, 448x448 images (256 image tokens each): tokens/s and peak memory against `ftune plan`.

    FTUNE_BENCH_OUT=results.json python bench/bench_vlm_qwen2.py

The results file is rewritten after each step, so a cut run keeps what it measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
OUT = Path(os.environ.get("FTUNE_BENCH_OUT", "vlm-qwen2.json"))
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220)}
QWEN25_VL_3B = {  # Qwen/Qwen2.5-VL-3B-Instruct's config.json (the shape only; weights are random)
    "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 16,
    "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 128000, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "tie_word_embeddings": True,
    "vision": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16, "out_hidden_size": 2048,
               "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112,
               "fullatt_block_indexes": [7, 15, 23, 31], "hidden_act": "silu", "in_chans": 3}}


def ftune(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ftune.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "FTUNE_CACHE": str(cwd / "cache")})


def colour_rows(folder: Path, rows: int, side: int) -> Path:
    """`rows` vision-chat rows of `side`-pixel squares, the colours in turn (chance is 1/3)."""
    from PIL import Image

    (folder / "img").mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(rows):
        name = sorted(COLOURS)[i % 3]
        Image.new("RGB", (side, side), COLOURS[name]).save(folder / "img" / f"{i}.png")
        out.append({"messages": [{"role": "user", "content": [{"type": "image", "image": f"img/{i}.png"},
                                                              {"type": "text", "text": "what colour"}]},
                                 {"role": "assistant", "content": name}]})
    path = folder / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in out))
    return path


def _recipe(folder: Path, model_dir: Path, rows: Path, **sections) -> Path:
    import yaml

    recipe = {"schema_version": 1, "name": "vlm-qwen2",
              "model": {"path": str(model_dir), "task": "image-text-to-text", "dtype": "float32"},
              "data": {"train": [{"path": str(rows), "format": "vision-chat"}], "eval": {"split": 0.2},
                       "max_seq_length": 64},
              "peft": {"method": "lora", "r": 8, "alpha": 16, "target_modules": "all-linear"},
              "train": {"max_steps": 30, "learning_rate": 1e-2, "per_device_batch_size": 8},
              "eval": {"strategy": "no", "generate": {"max_new_tokens": 6, "metrics": ["exact_match"]}},
              "checkpoint": {"strategy": "no"},
              "output": {"dir": str(folder / "run"), "report_to": ["none"], "loss_curve": False}}
    for key, value in sections.items():  # merged into the section; a None removes the key
        recipe[key] = {k: v for k, v in {**recipe.get(key, {}), **value}.items() if v is not None}
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def tiny(folder: Path) -> dict:
    """The tiny Qwen2-VL's learning test, merge and generate with images."""
    from transformers import AutoTokenizer

    from ftune.tiny import corpus, train_tokenizer
    from ftune.tiny_vision import build_tiny_qwen2_vl

    train_tokenizer(corpus(), folder / "tok", vocab_size=384)
    build_tiny_qwen2_vl(folder / "model", AutoTokenizer.from_pretrained(str(folder / "tok")))
    recipe = _recipe(folder, folder / "model", colour_rows(folder, 150, 28))
    t0 = time.perf_counter()
    run = ftune("run", str(recipe), cwd=folder)
    row: dict = {"run_s": round(time.perf_counter() - t0, 1), "run_code": run.returncode}
    if run.returncode != 0:
        return {**row, "error": run.stdout[-1500:] + run.stderr[-1500:]}
    metrics = [json.loads(x) for x in (folder / "run" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    row["losses"] = [round(m["loss"], 3) for m in metrics if "loss" in m]
    row["exact_match"] = next((m["eval_exact_match"] for m in metrics if "eval_exact_match" in m), None)
    merge = ftune("merge", str(folder / "run"), "--dtype", "float32", "--format", "json", cwd=folder)
    row["merge_code"] = merge.returncode
    if merge.returncode != 0:
        return {**row, "error": merge.stdout[-1500:] + merge.stderr[-1500:]}
    merged = json.loads(merge.stdout)
    row["merge"] = {k: merged.get(k) for k in ("max_diff", "tolerance", "sample_source", "images")}
    answers = {}
    for name, rgb in COLOURS.items():
        from PIL import Image

        Image.new("RGB", (28, 28), rgb).save(folder / f"{name}.png")
        gen = ftune("generate", str(folder / "run" / "merged"), "--prompt", "what colour", "--image",
                    str(folder / f"{name}.png"), "--max-new-tokens", "6", "--format", "json", cwd=folder)
        answers[name] = json.loads(gen.stdout)["results"][0]["completion"] if gen.returncode == 0 else \
            f"error: {gen.stderr[-300:]}"
    row["generate"] = answers
    row["learned"] = bool(row["exact_match"] is not None and row["exact_match"] >= 0.9
                          and all(answers[n] == n for n in COLOURS))
    return row


def shape_3b(folder: Path, steps: int = 10) -> dict:
    """A Qwen2.5-VL-3B shape (random bf16 weights, the tiny tokenizer with the vision tokens): LoRA tokens/s and
    peak memory against `ftune plan`'s estimate."""
    import torch
    from transformers import (AutoModelForImageTextToText, Qwen2_5_VLConfig, Qwen2_5_VLProcessor,
                              Qwen2VLImageProcessor, Qwen2VLVideoProcessor)

    from ftune.tiny import VLM_TEMPLATE, VLM_TOKENS, corpus, train_tokenizer
    from ftune.tiny_vision import QWEN_VISION_TOKENS

    tok = train_tokenizer(corpus(), folder / "tok", vocab_size=384)
    tok.add_special_tokens({"additional_special_tokens": [*VLM_TOKENS, *QWEN_VISION_TOKENS]})
    tok.eos_token = "<|im_end|>"
    side = 448
    sizes = dict(size={"shortest_edge": side * side, "longest_edge": side * side}, patch_size=14, merge_size=2,
                 temporal_patch_size=2)
    processor = Qwen2_5_VLProcessor(image_processor=Qwen2VLImageProcessor(**sizes), tokenizer=tok,
                                    video_processor=Qwen2VLVideoProcessor(**sizes),
                                    chat_template=VLM_TEMPLATE.replace("<image>", "".join(QWEN_VISION_TOKENS[:3])))
    shape = dict(QWEN25_VL_3B)
    vision = shape.pop("vision")
    ids = {name: tok.convert_tokens_to_ids(t) for name, t in (("vision_start_token_id", "<|vision_start|>"),
           ("vision_end_token_id", "<|vision_end|>"), ("image_token_id", "<|image_pad|>"),
           ("video_token_id", "<|video_pad|>"))}
    config = Qwen2_5_VLConfig(text_config={**shape, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
                                           "pad_token_id": tok.pad_token_id},
                              vision_config=vision, tie_word_embeddings=True, **ids)
    t0 = time.perf_counter()
    with torch.device("cuda"):
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(str(folder / "model"))
    processor.save_pretrained(str(folder / "model"))
    n_params = sum(p.numel() for p in model.parameters())
    del model
    torch.cuda.empty_cache()
    row: dict = {"params": n_params, "build_s": round(time.perf_counter() - t0, 1), "image_side": side}
    recipe = _recipe(folder, folder / "model", colour_rows(folder, 96, side),
                     model={"dtype": "bfloat16"},
                     data={"max_seq_length": 512, "eval": None, "images": {"max_pixels": side * side}},
                     peft={"r": 16, "alpha": 32},
                     train={"max_steps": steps, "per_device_batch_size": 4, "learning_rate": 1e-4,
                            "mixed_precision": "bf16", "gradient_checkpointing": True, "logging_steps": 1},
                     eval={"generate": None})
    plan = ftune("plan", str(recipe), "--format", "json", cwd=folder)
    estimate = json.loads(plan.stdout)["estimate"] if plan.returncode == 0 else {"error": plan.stderr[-800:]}
    run = ftune("run", str(recipe), cwd=folder, timeout=400)
    if run.returncode != 0:
        return {**row, "plan": estimate, "error": run.stdout[-1500:] + run.stderr[-1500:]}
    summary = json.loads((folder / "run" / "summary.json").read_text())
    measured, planned = summary.get("peak_memory_bytes"), estimate.get("total_bytes")
    return {**row, "steps": steps, "batch": 4, "tokens_per_s": round(summary["tokens_per_second"]),
            "peak_memory_bytes": measured, "plan_peak_bytes": planned,
            "plan_over_measured": round(planned / measured, 3) if measured and planned else None}


def main() -> dict:
    import torch

    results: dict = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0) if torch.cuda.is_available()
                     else "cpu"}
    try:
        import torchvision

        results["torchvision"] = torchvision.__version__
    except ImportError as err:
        results["torchvision"] = f"missing: {err}"
    work = Path(tempfile.mkdtemp(prefix="ftune-vlm-qwen2-"))
    for name, step in (("tiny_qwen2_vl", tiny), ("qwen2.5-vl-3b", shape_3b)):
        if name == "qwen2.5-vl-3b" and not torch.cuda.is_available():
            results[name] = {"skipped": "needs a CUDA device"}
            continue
        t0 = time.perf_counter()
        try:
            results[name] = step(work / name)
        except Exception as err:  # noqa: BLE001 - the record says what failed; the next step still runs
            results[name] = {"error": f"{type(err).__name__}: {err}"[-1500:]}
        results[name]["seconds"] = round(time.perf_counter() - t0, 1)
        OUT.write_text(json.dumps(results, indent=2) + "\n")
        print(f"{name}: {json.dumps(results[name])[:400]}", flush=True)
    return results


if __name__ == "__main__":
    main()
