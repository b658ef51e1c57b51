"""`ftune run RECIPE [key=value ...] [--dry-run]`: validate, compile a plan, and train through accelerate launch."""

from __future__ import annotations

import argparse
import shlex
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", help="recipe YAML file")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="override recipe keys, e.g. train.max_steps=10")
    p.add_argument("--dry-run", action="store_true", help="print the plan and the launch command; train nothing")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="with --dry-run: `json` prints the plan as JSON only (the launch command is in it)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ftune.cli.imports import block_bitsandbytes
    from ftune.errors import RecipeError
    from ftune.plan.compile import compile_with_model
    from ftune.recipe import load_recipe

    console = Console(highlight=False)
    loaded = load_recipe(args.recipe, args.overrides)
    block_bitsandbytes(loaded.recipe)  # the parent never quantizes; the worker decides for itself
    from ftune.estimate.autobatch import chooser

    compiled = compile_with_model(loaded, choose=chooser())  # every pre-launch check: refused here, nothing is written or locked yet
    plan = compiled.plan
    warnings = list(plan.warnings)
    if plan.model_load.gguf is not None:  # the compiler chose the cached folder; the parent fills it, once
        from ftune.launch.gguf import materialize

        warnings += materialize(plan, loaded, log=console.print)
    if args.dry_run and args.format == "json":
        print(plan.model_dump_json(indent=2))  # pure JSON on stdout; warnings go to stderr
    for w in warnings:
        print(w, file=sys.stderr)
    command = shlex.join(plan.launch.command)
    if args.dry_run:
        if args.format == "text":
            console.print_json(plan.model_dump_json())
            console.print(f"[bold]launch:[/bold] {command}", soft_wrap=True)
        return 0
    from ftune.cli.show import origins
    from ftune.launch.launcher import launch

    console.print(f"[dim]$ {command}[/dim]", soft_wrap=True)
    estimate = memory_estimate(plan, compiled.meta) if plan.recipe.output.report else None
    del compiled  # its meta model is not held in this process while the run goes on
    try:
        return launch(plan, loaded.resolved_yaml(), secret_env=loaded.secret_env,
                      debug=getattr(args, "debug", False), origins=origins(loaded, tuple(args.overrides)),
                      estimate=estimate)
    except RecipeError as err:  # found by the worker: located at the keys the user wrote, as at plan time
        raise loaded.error(err.problems) from None


def memory_estimate(plan, meta=None) -> dict | None:
    """`ftune plan`'s memory estimate, for the report's measured-against-estimated memory (`output.report`), on
    `meta`, the compile's meta model (none: built here). A recipe the estimate can't model (a refusal of its own)
    gets none: the page says so, the run goes on."""
    from ftune.errors import FtuneError
    from ftune.estimate.estimate import estimate

    try:
        est = estimate(plan.recipe, world_size=plan.world_size, num_processes=plan.num_processes, gpu_memory=None,
                       device=plan.device, meta=meta)
    except FtuneError:
        return None
    return {"peak_bytes": est.total_bytes, "peak_phase": est.peak_phase, "device": est.device,
            "items": [{"kind": m.kind, "detail": m.detail, "bytes": m.bytes, "phase": m.phase} for m in est.memory]}
