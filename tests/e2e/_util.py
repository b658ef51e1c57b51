"""Helpers for end-to-end tests: write a recipe, run the real `ftune` CLI in a subprocess, read results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def write_recipe(folder: Path, recipe: dict, name: str = "recipe.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def ftune(*args: str, cwd: Path, env: dict | None = None, timeout: int = 300) -> Result:
    proc = subprocess.run(
        [sys.executable, "-m", "ftune.cli.main", *args],
        cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def losses(run_dir: Path) -> list[float]:
    return [m["loss"] for m in metrics(run_dir) if "loss" in m]


def eval_losses(run_dir: Path) -> list[float]:
    return [m["eval_loss"] for m in metrics(run_dir) if "eval_loss" in m]


def base_recipe(model_dir: Path, data_file: Path, **sections) -> dict:
    """A small, fast causal-LM recipe on the tiny model; sections are merged into (peft: replaces) the defaults."""
    recipe = {
        "schema_version": 1,
        "name": "e2e",
        "model": {"path": str(model_dir), "dtype": "float32"},
        "data": {
            "train": [{"path": str(data_file), "format": "text"}],
            "eval": {"split": 0.1},
            "max_seq_length": 64,
        },
        "peft": {"method": "lora", "r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
        "train": {"max_steps": 30, "learning_rate": 5e-3, "per_device_batch_size": 8, "logging_steps": 5,
                  "seed": 7, "warmup_steps": 0},
        "eval": {"strategy": "steps", "steps": 15},
        "checkpoint": {"strategy": "steps", "steps": 15, "keep": 2},
        # loss_curve.png costs a matplotlib import and a draw, about 0.75 CPU s per run: test_run.py checks it
        "output": {"dir": "runs/e2e", "report_to": ["tensorboard"], "loss_curve": False},
    }
    for key, value in sections.items():
        if key != "peft" and isinstance(value, dict) and isinstance(recipe.get(key), dict):
            recipe[key] = {**recipe[key], **value}
        else:
            recipe[key] = value
    return recipe
