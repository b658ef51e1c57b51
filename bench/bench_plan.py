"""`ftune plan` accuracy: estimated peak memory ÷ measured peak of a real CPU training step, 3 recipe shapes.

Method: the shapes are measured in one fresh Python process. It first runs every shape once on a
1-layer model (imports, thread pools, kernels, every code path), then, per shape: frees what it can,
resets the kernel's peak-RSS counter (`echo 5 > /proc/self/clear_refs`), reads the resident set size
(RSS) as the baseline, builds the model, applies the method with the same `inject` the worker uses and
runs 2 steps (forward, backward, AdamW step, zero_grad). Peak RSS (`VmHWM`) minus the baseline is the
measured peak. glibc's mmap threshold is pinned at 64 KiB (`MALLOC_MMAP_THRESHOLD_`) so
every tensor is its own mapping and is returned to the OS when freed: RSS then follows live tensor
bytes instead of the allocator's high-water mark. The model (38M parameters, fp32) is big enough that
the few MiB of untracked process noise stay under 2% of the peaks measured.

Run: `.venv/bin/python bench/bench_plan.py` (about a minute on 2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MODEL = dict(
    hidden_size=768,
    intermediate_size=2048,
    num_hidden_layers=4,
    num_attention_heads=12,
    num_key_value_heads=4,
    vocab_size=8192,
    max_position_embeddings=1024,
    tie_word_embeddings=False,
)
BATCH, SEQ = 2, 256
LORA = {"method": "lora", "r": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
SHAPES: dict[str, dict] = {
    "lora": {"peft": LORA},
    "full": {"peft": {"method": "full"}},
    "lora+checkpointing": {"peft": LORA, "train": {"gradient_checkpointing": True}},
}


def write_model(folder: Path, **overrides) -> Path:
    """A Llama config.json (no weights: the estimate reads only the config, the measurement initialises)."""
    from transformers import LlamaConfig

    LlamaConfig(**{**MODEL, **overrides}).save_pretrained(str(folder))
    return folder


def recipe_dict(shape: str, model_dir: Path, batch: int = BATCH, seq: int = SEQ) -> dict:
    base = {
        "name": f"bench-{shape.replace('+', '-')}",
        "model": {"path": str(model_dir), "dtype": "float32", "init": "random"},
        "data": {"train": [{"path": "unused.jsonl"}], "max_seq_length": seq},
        "train": {"per_device_batch_size": batch, "max_steps": 2},
    }
    extra = SHAPES.get(shape, {})
    for key, value in extra.items():
        base[key] = {**base.get(key, {}), **value}
    return base


def _status(field: str) -> int:
    """A /proc/self/status memory field (VmRSS, VmHWM) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _child(recipes_json: str) -> list[dict]:
    """Runs in the fresh process: per recipe, baseline RSS, then 2 real training steps; bytes measured."""
    import ctypes
    import gc

    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from ftune.methods import method_module
    from ftune.recipe.schema import Recipe

    def step(model, opt, ids):
        model(input_ids=ids, labels=ids).loss.backward()
        grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return grads

    def run(recipe: Recipe, config: LlamaConfig, measure: bool) -> dict:
        batch, seq = recipe.train.per_device_batch_size, recipe.data.max_seq_length
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
        base = _status("VmRSS")
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
        model = method_module(recipe.peft.method).inject(model, recipe.peft, recipe.model.task)
        if recipe.train.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        ids = torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
        grads = [step(model, opt, ids) for _ in range(2)]
        peak = _status("VmHWM") - base
        weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
        states = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
                     if isinstance(t, torch.Tensor))
        return {"peak": peak, "weights": weights, "gradients": grads[-1], "optimizer": states}

    recipes = [Recipe.model_validate(r) for r in json.loads(recipes_json)]
    tiny = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=256)
    for recipe in recipes:  # warm-up: imports, thread pools, kernels, every code path once
        run(recipe, tiny, False)
    return [run(r, LlamaConfig.from_pretrained(r.model.path), True) for r in recipes]


def measure(recipes: list[dict], timeout: int = 900) -> list[dict]:
    """Measured bytes of a real CPU training step of each recipe, in one fresh process (see the module doc)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    code = f"import sys, json; sys.path.insert(0, {str(REPO)!r}); from bench.bench_plan import _child; " \
           f"print('RESULT', json.dumps(_child(sys.argv[1])))"
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(recipes)], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=str(REPO))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"measurement failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def estimated(recipe: dict) -> dict:
    from ftune.estimate.estimate import estimate
    from ftune.recipe.schema import Recipe

    est = estimate(Recipe.model_validate(recipe), world_size=1, num_processes=1, gpu_memory=None, device="cpu")
    by_kind: dict[str, int] = {}
    for item in est.memory:
        by_kind[item.kind] = by_kind.get(item.kind, 0) + item.bytes
    return {"peak": est.total_bytes, **by_kind, "estimate": est}


def main() -> dict:
    """Estimate ÷ measured peak for each shape; prints a table and returns {shape: {...}}."""
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="ftune-bench-plan-") as tmp:
        model_dir = write_model(Path(tmp) / "model")
        recipes = [recipe_dict(shape, model_dir) for shape in SHAPES]
        measured = measure(recipes)
        print(f"{'shape':<20} {'estimate MiB':>13} {'measured MiB':>13} {'ratio':>7}")
        for shape, recipe, meas in zip(SHAPES, recipes, measured):
            est = estimated(recipe)
            ratio = est["peak"] / meas["peak"]
            results[shape] = {"estimate_bytes": est["peak"], "measured_bytes": meas["peak"], "ratio": round(ratio, 3)}
            print(f"{shape:<20} {est['peak'] / 2**20:>13.1f} {meas['peak'] / 2**20:>13.1f} {ratio:>7.3f}")
    return results


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(json.dumps(main(), indent=2))
