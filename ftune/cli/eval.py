"""`ftune eval RECIPE [key=value ...] [--model DIR] [--format json]`: evaluate a trained model, no training.

By default the model is the run's `final/` (an adapter is loaded on the recipe's base model). Runs in
this process on the recipe's eval data, with the same Trainer evaluation as `ftune run`; with
`eval.generate` set (or `--generate`) it also scores greedy completions of the eval prompts (exact match, F1).
An online RL recipe (grpo, rloo) is scored by its own rewards on greedy completions of its eval prompts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from ftune.errors import FtuneError


HIDDEN_METRICS = ("epoch", "eval_model_preparation_time")
"""Trainer bookkeeping that says nothing about an evaluation of a saved model (there is no epoch)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", help="recipe YAML file")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="override recipe keys")
    p.add_argument("--model", help="model or adapter folder (default: <output.dir>/final)")
    p.add_argument("--generate", action="store_true",
                   help="also score greedy completions (exact match, F1) with eval.generate's defaults when it is unset")
    p.add_argument("--format", choices=["text", "json"], default="text")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ftune.plan.compile import compile_plan
    from ftune.recipe import load_recipe

    loaded = load_recipe(args.recipe, args.overrides)
    os.environ.update(loaded.secret_env)  # secrets given as overrides: read through the plan like env secrets
    plan = compile_plan(loaded, check_inputs=False, environ={})  # one process: no launcher
    from ftune.plan.gguf import materialize

    for warning in materialize(plan, loaded, log=lambda line: print(line, file=sys.stderr)):  # a GGUF: as `run` does
        print(warning, file=sys.stderr)
    model_dir = Path(args.model) if args.model else plan.run.final
    if not model_dir.is_dir():
        raise FtuneError(f"no model at {model_dir}", hint="train first with `ftune run`, or pass --model DIR")
    from ftune.infer.load import check_fits

    check_fits(plan, model_dir)  # a task mismatch or a truncated weights file, before the data stage runs
    section = plan.recipe.eval.generate
    if args.generate and section is None:
        from ftune.recipe.rules.core import eval_generate_needs_prompts
        from ftune.recipe.schema import GenerateEval

        section = GenerateEval()
        with_generate = plan.recipe.model_copy(update={"eval": plan.recipe.eval.model_copy(update={"generate": section})})
        problems = list(eval_generate_needs_prompts(with_generate))
        if problems:
            raise loaded.error(problems)
    from ftune.infer.evaluate import evaluate
    from ftune.launch.lock import claim
    from ftune.quiet import quiet_libraries

    quiet_libraries()

    lock, _ = claim(plan.run, "eval")  # one live run per run dir: not while `ftune run` trains into it
    with lock:
        metrics = evaluate(plan, model_dir, section,
                           log=None if sys.stdout.isatty() or args.format == "json" else print)
    metrics = {k: v for k, v in metrics.items() if k not in HIDDEN_METRICS}
    bad = [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        print(f"ftune: warning: {', '.join(bad)} not finite: the model's outputs hold NaN or infinity "
              f"(check {model_dir}: was it trained with a too-high learning rate, or saved from another base?)",
              file=sys.stderr)
    if args.format == "json":
        print(json.dumps({"model": str(model_dir), "metrics": metrics}, indent=2))
    else:
        console = Console(highlight=False)
        console.print(f"[bold]eval[/bold] {model_dir}")
        for key, value in metrics.items():
            console.print(f"  {key:24s} {value:.6g}" if isinstance(value, float) else f"  {key:24s} {value}")
        if section is not None and plan.run.predictions.is_file():
            show_predictions(console, plan.run.predictions)
    return 0


SHOWN_PREDICTIONS = 3


def show_predictions(console, path: Path) -> None:
    """A few of the scored completions, so a score comes with what it scored; the file holds every row."""
    from rich.markup import escape

    from ftune.generation import read_predictions

    console.print(f"[bold]predictions[/bold] {path} (first {SHOWN_PREDICTIONS})")
    for row in read_predictions(path, SHOWN_PREDICTIONS):
        scores = ", ".join(f"{k} {v:.2f}" for k, v in row["scores"].items())
        for label in ("prompt", "reference", "completion"):
            text = " ".join(str(row[label]).split())
            console.print(f"  {label:10s} {escape(text[:160] + ('…' if len(text) > 160 else ''))}")
        console.print(f"  {'scores':10s} {scores}\n")
