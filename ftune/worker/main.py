"""The worker: `accelerate launch ... -m ftune.worker <run>/plan.json` runs the stages in order.

It decides nothing the Plan already says. Errors are written to `<run>/error.json` (rank 0) so the
launcher can report them without a traceback; the traceback is kept there for --debug.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback

from ftune.errors import EXIT_INTERRUPTED, EXIT_RUNTIME, FtuneError
from ftune.plan.model import Plan
from ftune.rundir import RunDir, write_json_atomic


def _quiet_libraries() -> None:
    """ftune prints its own progress; library progress bars and advisory warnings would drown it."""
    import logging
    import warnings

    import datasets
    from transformers.utils import logging as hf_logging

    datasets.disable_progress_bars()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # optional CPU kernels package missing: harmless
    warnings.filterwarnings("ignore", message=".*use_reentrant.*")


def run_stages(plan: Plan) -> dict:
    from rich.console import Console

    from ftune.worker import data, distributed, facts, report, save, tokenizer, train
    from ftune.worker.callbacks import make_callbacks
    from ftune.worker.model import load_model
    from ftune.worker.peft import apply_method

    recipe = plan.recipe
    run = plan.run

    _quiet_libraries()
    distributed.prepare(plan)
    args = train.training_arguments(plan)  # sets up the process group
    main = args.process_index == 0
    console = Console(stderr=False, highlight=False) if main else None

    tok = tokenizer.load_tokenizer(plan)
    bundle = data.build(recipe, tok, main_process_first=lambda: args.main_process_first(desc="preprocessing"),
                        log=console.print if console else (lambda *a, **k: None))
    model = load_model(plan, tok, labels=bundle.label_names)
    quant_line = None
    if recipe.quantization is not None:
        from ftune.estimate.quant import describe, describe_line
        from ftune.worker import quantize

        model = quantize.prepare(model, recipe)
        quant_line = describe_line(describe(recipe, model))
    model, counts = apply_method(model, plan, tokenizer.trained_token_ids(tok, recipe.model))
    if main and save.converts_initial(plan):
        save.save_initial_adapter(model, run.initial_adapter)
    if console:
        report.header(console, plan, counts, bundle, quant_line)
        run.params.write_text(json.dumps({"trainable": counts.trainable, "total": counts.total}) + "\n")

    trainer = train.build_trainer(plan, model, tok, bundle, args, make_callbacks(plan, console))
    if facts.enabled():
        facts.record(trainer, run, args.process_index)

    trainer.train(resume_from_checkpoint=plan.resume_from)
    final_metrics = trainer.evaluate() if trainer.eval_dataset is not None else {}
    saved = save.save_final(trainer, plan, tok)
    result = {}
    if console:
        result = report.summary(console, plan, final_metrics, saved)
        if recipe.output.loss_curve:
            report.loss_curve(run)
    return result


def _write_error(run: RunDir, payload: dict) -> None:
    if int(os.environ.get("RANK", "0")) != 0 and run.error.exists():
        return
    write_json_atomic(run.error, payload)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the launcher's accelerate ignores Ctrl-C; we don't
    plan = Plan.load(argv[0])
    run = plan.run
    debug = os.environ.get("FTUNE_DEBUG") == "1"
    try:
        run_stages(plan)
        return 0
    except FtuneError as err:
        _write_error(run, {"kind": "user", "message": err.message, "hint": err.hint,
                               "exit_code": err.exit_code, "traceback": traceback.format_exc()})
        if debug:
            traceback.print_exc()
        return err.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as err:  # noqa: BLE001 - reported by the launcher, traceback kept in error.json
        _write_error(run, {"kind": "internal", "message": f"{type(err).__name__}: {err}",
                               "hint": None, "exit_code": EXIT_RUNTIME, "traceback": traceback.format_exc()})
        if debug:
            traceback.print_exc()
        return EXIT_RUNTIME

