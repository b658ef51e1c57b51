"""`ftune merge RUN_DIR_OR_RECIPE [--out DIR] [--dtype D] [--shard-size 5GB]`: a run's output as a plain HF model.

LoRA (QLoRA too, onto the base loaded unquantized) is folded into its base; full and freeze runs are re-sharded;
prefix tuning and LLaMA-Adapter are refused. The result is checked against the unmerged model before it appears.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ftune.infer.merge import DTYPES

    p.add_argument("target", metavar="RUN_DIR_OR_RECIPE", help="a run dir (runs/NAME), its final/, or its recipe file")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="override recipe keys (with a recipe file)")
    p.add_argument("--out", help="output folder (default: <run dir>/merged)")
    p.add_argument("--dtype", choices=DTYPES, help="dtype of the merged weights (default: model.dtype, else bfloat16)")
    p.add_argument("--shard-size", default="5GB", help="largest safetensors shard (default: 5GB)")
    p.add_argument("--force", action="store_true", help="replace an existing output folder, if it is a merge ftune wrote")
    p.add_argument("--format", choices=["text", "json"], default="text")


def _run_lock(target):
    import contextlib

    from ftune.rundir import RunDir

    run = RunDir(target.model_dir.parent)  # the run dir final/ sits in (a moved run's plan.json names the old one)
    if target.plan is None or not run.is_owned():
        return contextlib.nullcontext()
    from ftune.launch.lock import claim

    lock, _ = claim(run, "merge")
    return lock


def run(args: argparse.Namespace) -> int:
    import sys

    from ftune.estimate.units import parse_bytes
    from ftune.infer.merge import merge
    from ftune.infer.source import resolve

    shard_size = parse_bytes(args.shard_size, "--shard-size", decimal=True)  # before anything is loaded
    target = resolve(args.target, args.overrides)
    say = (lambda s: print(s, file=sys.stderr)) if args.format == "json" else print
    with _run_lock(target):  # not while `ftune run` trains into the same run dir
        result = merge(target, out=Path(args.out) if args.out else None, dtype=args.dtype,
                       shard_size=shard_size, force=args.force, log=say)
    if args.format == "json":
        print(json.dumps(asdict(result), indent=2))
        return 0
    print(f"{result.action} {target.model_dir} -> {result.out}")
    print(f"  base        {result.base}")
    print(f"  verified    max |logit difference| {result.max_diff:.3g} <= {result.tolerance:.3g} ({result.dtype}, "
          f"{result.sample_source})")
    if result.quantized:
        print(f"  quantized   {result.quantized} (torchao, as the run trained it; compared with the fake-quantized "
              "model above; loading it needs torchao)")
    if result.experts_checked:
        print(f"  experts     {result.experts_checked} experts compared one by one (every token routed to each)")
    print(f"  files       {', '.join(result.files)}")
    if target.plan.recipe.model.task == "image-text-to-text":
        print(f"  load it     AutoModelForImageTextToText.from_pretrained({result.out!r}) and "
              f"AutoProcessor.from_pretrained({result.out!r})  (no peft needed)")
    else:
        print(f"  load it     AutoModelForCausalLM.from_pretrained({result.out!r})  (no peft needed)")
    return 0
