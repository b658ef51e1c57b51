"""`ftune eval RECIPE [key=value ...] [--model DIR] [--format json]`: evaluate a trained model, no training.

`ftune eval RUN_DIR|RECIPE|MODEL_DIR [--model DIR] --benchmarks [TASK ...]` runs lm-eval harness tasks instead (the
recipe's eval.benchmarks, or the TASKs named) on the run's final/, a merged folder or any model folder; the text
table shows the run's start measurement beside it when the run made one.

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
    p.add_argument("--benchmarks", nargs="*", metavar="TASK",
                   help="run lm-eval harness tasks: the TASKs named, else the recipe's eval.benchmarks.tasks "
                        "(needs `pip install \"ftune[eval]\"`); RECIPE may then be a run dir or a model folder")
    p.add_argument("--include", action="append", default=[], metavar="DIR",
                   help="with --benchmarks: a folder of local task YAMLs (besides eval.benchmarks.include)")
    p.add_argument("--limit", type=int, help="with --benchmarks: rows per task (default: eval.benchmarks.limit)")
    p.add_argument("--format", choices=["text", "json"], default="text")


def run(args: argparse.Namespace) -> int:
    if args.benchmarks is not None:
        return run_benchmarks(args)
    from rich.console import Console

    from ftune.plan.compile import compile_plan
    from ftune.recipe import load_recipe

    loaded = load_recipe(args.recipe, args.overrides)
    os.environ.update(loaded.secret_env)  # secrets given as overrides: read through the plan like env secrets
    plan = compile_plan(loaded, check_inputs=False, environ={})  # one process: no launcher
    from ftune.launch.gguf import materialize

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


def _bench_plan(args, plan):
    """What to run: the recipe's eval.benchmarks (include folders as compiled), the command line's TASKs, folders
    and limit over it."""
    from ftune import benchmarks
    from ftune.errors import UsageError

    base = plan.benchmarks if plan is not None else None
    tasks = args.benchmarks or (base.tasks if base is not None else [])
    if not tasks:
        raise UsageError("--benchmarks names no task and the recipe has no eval.benchmarks",
                         hint="name them: `--benchmarks arc_easy my_task` (local tasks: `--include DIR`)")
    if args.limit is not None and args.limit <= 0:
        raise UsageError(f"--limit must be positive, got {args.limit}", hint="rows per task, e.g. --limit 100")
    include = [*(base.include if base is not None else []), *[str(Path(d).resolve()) for d in args.include]]
    missing = [d for d in include if not Path(d).is_dir()]
    if missing:
        raise FtuneError(f"task folder not found: {missing[0]}", hint="--include names a folder of lm-eval task YAMLs")
    return benchmarks.BenchmarkPlan(tasks=list(tasks), include=include,
                                    num_fewshot=base.num_fewshot if base is not None else None,
                                    limit=args.limit if args.limit is not None else (base.limit if base else None),
                                    batch_size=base.batch_size if base is not None else 8)


def run_benchmarks(args: argparse.Namespace) -> int:
    """`--benchmarks`: the harness's scores of the model as JSON or a table (with the run's start measurement)."""
    from ftune import benchmarks
    from ftune.infer.source import resolve

    if not benchmarks.harness_installed():
        raise FtuneError("--benchmarks runs EleutherAI's lm-eval harness, which is not installed",
                         hint=benchmarks.INSTALL)
    source = None if args.model else resolve(args.recipe, args.overrides, allow_model=True)
    plan = source.plan if source is not None else _plan_of(args)
    target = source if source is not None else resolve(args.model, allow_model=True)
    bench = _bench_plan(args, plan)
    from ftune.benchmarks.harness import run
    from ftune.infer.load import load_for_generation

    loaded = load_for_generation(target)
    scores, seconds = run(loaded.model, loaded.tokenizer, bench)
    start = None
    if plan is not None and target.model_dir == plan.run.final:
        from ftune.rundir import read_metrics

        measured = benchmarks.summary(read_metrics(plan.run))
        start = measured["start"] if measured else None
    if args.format == "json":
        print(json.dumps({"benchmarks": scores, "model": str(target.model_dir), "limit": bench.limit,
                          "num_fewshot": bench.num_fewshot, "seconds": round(seconds, 3),
                          **({"start": start} if start else {})}, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"benchmarks · {loaded.description}" + (f" · {bench.limit} rows per task" if bench.limit else ""),
                  title_justify="left")
    for column in ("task", "metric", *(["start"] if start else []), "value", "± stderr", *(["change"] if start else [])):
        table.add_column(column, justify="left" if column in ("task", "metric") else "right")
    for task, metrics in scores.items():
        for metric, value in metrics.items():
            name = metric.split(",")[0]
            if name.endswith("_stderr"):
                continue
            stderr = metrics.get(name + "_stderr" + metric[len(name):])
            before = (start or {}).get(task, {}).get(metric)
            row = [task, metric, *([f"{before:.4f}" if before is not None else "-"] if start else []), f"{value:.4f}",
                   f"{stderr:.4f}" if stderr is not None else "-",
                   *([f"{value - before:+.4f}" if before is not None else "-"] if start else [])]
            table.add_row(*row)
    Console(highlight=False).print(table)
    return 0


def _plan_of(args):
    """The run's Plan when `--model` is given beside a recipe or run dir (its eval.benchmarks); None for a model
    folder."""
    from ftune.infer.source import _plan as read_plan
    from ftune.rundir import RunDir

    path = Path(args.recipe).expanduser()
    if path.is_file():
        from ftune.plan.compile import compile_plan
        from ftune.recipe import load_recipe

        loaded = load_recipe(str(path), args.overrides)
        return compile_plan(loaded, check_inputs=False, environ={})
    if RunDir(path).plan.is_file():
        return read_plan(path)
    return None
