"""`ftune eval RECIPE [key=value ...] [--model DIR] [--format json]`: evaluate a trained model, no training.

By default the model is the run's `final/` (an adapter is loaded on the recipe's base model). Runs in
this process on the recipe's eval data, with the same Trainer evaluation as `ftune run`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from ftune.errors import FtuneError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", help="recipe YAML file")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="override recipe keys")
    p.add_argument("--model", help="model or adapter folder (default: <output.dir>/final)")
    p.add_argument("--format", choices=["text", "json"], default="text")


def load_trained(plan, model_dir: Path, tokenizer, labels: list[str] | None = None):
    """The trained model from `model_dir`: a full model folder, or an adapter put on the recipe's base."""
    from ftune.plan.loading import model_load
    from ftune.worker.model import load_model

    if (model_dir / "adapter_config.json").is_file():
        from peft import PeftModel

        from ftune.worker import quantize

        # Quantize the base as the adapter was trained (final/ftune.json records it), guarded and upcast like
        # k-bit preparation, so eval reproduces the logged loss.
        section = quantize.recorded_quantization(model_dir) or plan.recipe.quantization
        recipe = plan.recipe.model_copy(update={"quantization": section})
        base = load_model(plan, tokenizer, labels=labels, spec=model_load(recipe))
        if section is not None:
            base = quantize.prepare_for_eval(base, recipe)
        return PeftModel.from_pretrained(base, str(model_dir))
    if (model_dir / "config.json").is_file():
        return load_model(plan, tokenizer, spec=model_load(plan.recipe, path=str(model_dir)))
    raise FtuneError(f"{model_dir} holds neither a model (config.json) nor an adapter (adapter_config.json)",
                     hint="pass --model pointing at a run's final/ folder or a checkpoint")


def evaluate(plan, model_dir: Path) -> dict:
    from ftune.worker import data, tokenizer, train

    tok = tokenizer.load_tokenizer(plan)
    bundle = data.build(plan.recipe, tok, log=lambda *a, **k: None)
    if bundle.eval is None:
        raise FtuneError("the recipe has no eval data", hint="set data.eval (e.g. `data.eval={split: 0.1}`)")
    model = load_trained(plan, model_dir, tok, labels=bundle.label_names)
    args = train.eval_arguments(plan)
    trainer = train.build_trainer(plan, model, tok, bundle, args, callbacks=[])
    return trainer.evaluate(eval_dataset=bundle.eval)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ftune.plan.compile import compile_plan
    from ftune.recipe import load_recipe

    loaded = load_recipe(args.recipe, args.overrides)
    os.environ.update(loaded.secret_env)  # secrets given as overrides: read through the plan like env secrets
    plan = compile_plan(loaded, check_inputs=False)
    model_dir = Path(args.model) if args.model else plan.run.final
    if not model_dir.is_dir():
        raise FtuneError(f"no model at {model_dir}", hint="train first with `ftune run`, or pass --model DIR")
    from ftune.launch.lock import claim

    lock, _ = claim(plan.run, "eval")  # one live run per run dir: not while `ftune run` trains into it
    with lock:
        metrics = evaluate(plan, model_dir)
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
    return 0
