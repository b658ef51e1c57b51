"""The worker: `accelerate launch ... -m ftune.worker <run>/plan.json` runs the stages in order.

The order, written once (here and in docs/ARCHITECTURE.md), as `run_stages` runs it:
distributed (the CPU FSDP shim, the process group) → tokenizer → data → model → quantize (k-bit preparation,
when quantized) → peft → train → save. It decides nothing the Plan already says. Errors are written to `<run>/error.json` (rank 0) so the
launcher can report them without a traceback; the traceback is kept there for --debug.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import traceback
from pathlib import Path

from ftune.errors import EXIT_INTERRUPTED, EXIT_RUNTIME, FtuneError, disk_full
from ftune.lifecycle import PLAN_DIGEST_ENV, die_with_parent
from ftune.plan.plan import Plan
from ftune.rundir import RunDir, is_complete, write_json_atomic
from ftune.worker import distributed
from ftune.quiet import quiet_libraries
from ftune.worker.stop import STOP, Terminated, terminated_error


def run_stages(plan: Plan) -> dict:
    from rich.console import Console

    from ftune import plugins
    from ftune import datastage as data
    from ftune.datastage import tokenizer
    from ftune.runtime import train
    from ftune.runtime.model import load_model
    from ftune.runtime.rl import StopDuringReward
    from ftune.worker import benchmarks, card, facts, hold, profile, report, save
    from ftune.worker.callbacks import make_callbacks, write_live_report
    from ftune.worker.moe import router_stats
    from ftune.worker.peft import apply_method

    recipe = plan.recipe
    run = plan.run

    quiet_libraries()
    distributed.prepare(plan)
    args = train.training_arguments(plan)  # sets up the process group
    distributed.check_world(plan, args.world_size)
    distributed.record_hosts(plan)
    main = args.process_index == 0
    console = Console(stderr=False, highlight=False) if main else None

    processor = tokenizer.load_processor(plan)  # a vision-language model's (image processor + tokenizer)
    tok = processor.tokenizer if processor is not None else tokenizer.load_tokenizer(plan)
    bundle = data.build(recipe, tok, plan.data, main_process_first=lambda: args.main_process_first(desc="preprocessing"),
                        log=console.print if console else (lambda *a, **k: None), processor=processor)
    model = load_model(plan, tok, labels=bundle.label_names)
    quant_line = None
    if recipe.kbit is not None:
        from ftune.estimate.quant import describe, describe_line
        from ftune.worker import quantize

        model = quantize.prepare(model, upcast=plan.upcast_non_quantized,
                                 checkpointing=plan.activation_checkpointing == "trainer")
        quant_line = describe_line(describe(recipe, model))
    model, counts = apply_method(model, plan, tokenizer.trained_token_ids(tok, recipe.model))
    if recipe.qat is not None:  # the trained linears fake-quantized (full and freeze runs: rules.quantization)
        from ftune.runtime import qat

        model = qat.prepare(model, recipe.qat)
    if main and save.converts_initial(plan):
        save.save_initial_adapter(model, run.initial_adapter)
    if console:
        report.header(console, plan, counts, bundle, quant_line)

    stats = bundle.report  # tokens per row iterated (packed rows when packing), as the data stage counted them
    if stats.streaming:  # nothing counted before training: a full row per sample when packing
        tokens_per_step = (recipe.data.max_seq_length or 0) * plan.effective_batch_size if stats.packing else 0
    else:
        tokens_per_step = stats.tokens / max(stats.packed_rows or stats.train_samples, 1) * plan.effective_batch_size
    if console:  # tokens_per_step: the report's tokens/s between two logs
        run.params.write_text(json.dumps({"trainable": counts.trainable, "total": counts.total,
                                          "tokens_per_step": round(tokens_per_step, 3)}) + "\n")
    callbacks = make_callbacks(plan, console, tokens_per_step) + plugins.make_callbacks(recipe.train.callbacks)
    if (bench := benchmarks.make_callback(plan, tok, console)) is not None:  # eval.benchmarks (lm-eval harness)
        callbacks.append(bench)
    moe_stats = router_stats(plan, model)  # first: it adds aux_loss and the expert share to the logs written
    callbacks = [moe_stats, *callbacks] if moe_stats is not None else callbacks
    # TRL's trainers take image rows through the processor; the sft family's collator holds it already
    trl_images = processor is not None and plan.data.rows != "sft"
    if trl_images:  # a hub id's family is known only now (a local folder's was checked before launch)
        from ftune.models.vision_parts import trl_images_problem

        why = trl_images_problem(getattr(model.config, "model_type", None))
        if why is not None:
            raise FtuneError(f"train.objective '{recipe.train.objective}' on {model.config.model_type} image rows "
                             f"is not supported: {why}", hint="train this family with `train.objective: sft`")
    if recipe.qat is not None and recipe.qat.start_after_steps:
        callbacks.append(qat.start_callback(recipe.qat))
    trainer = train.build_trainer(plan, model, processor if trl_images else tok, bundle, args, callbacks)
    if plan.tiled_mlp_shards is not None:  # once the trainer's Liger kernels have patched each MLP's forward
        from ftune.plan.tiling import mlps
        from ftune import tiled_mlp

        tiled = tiled_mlp.apply(mlps(trainer.model), plan.tiled_mlp_shards)
        if console:
            console.print(f"tiled MLP: {tiled} decoder MLPs, slices: {plan.tiled_mlp_shards}")
    if plan.tiled_loss_shards is not None:
        from ftune import tiled_loss

        tiled_loss.apply(trainer.model, plan.tiled_loss_shards)
        if console:
            console.print(f"tiled loss: the output head and loss in slices: {plan.tiled_loss_shards}")
    if facts.enabled():
        facts.record(trainer, run, args.process_index)
    if profile.enabled():
        trainer.add_callback(profile.callback(args.process_index))
    if hold.enabled():  # tests that signal a run hold it at a step first
        trainer.add_callback(hold.callback(args.process_index))

    if plan.resume_from is not None:
        stop_at_max_steps(trainer)
    try:
        trainer.train(resume_from_checkpoint=plan.resume_from)
    except StopDuringReward as err:  # SIGTERM while a reward scored: the last complete step was checkpointed
        raise terminated_error(err.step, err.checkpoint) from None
    if STOP.requested and STOP.phase != "setup":  # SIGTERM while training: a checkpoint of this step was saved
        step = trainer.state.global_step
        folder = run.checkpoints / f"checkpoint-{step}"
        raise terminated_error(step, str(folder) if is_complete(folder) else None)
    final_metrics = final_eval(trainer) if trainer.eval_dataset is not None else {}
    if recipe.eval.generate is not None and trainer.eval_dataset is not None:
        final_metrics.update(_generation_metrics(plan, trainer, tok, console))
    if recipe.qat is not None:  # final/ holds the trained full-precision weights; `ftune merge` quantizes them
        qat.unwrap(trainer.model)
    saved = save.save_final(trainer, plan, processor or tok)
    result = {}
    if console:
        card.write(plan, final_metrics, trainer.state.global_step)
        result = report.summary(console, plan, final_metrics, saved, tokens_per_step)
        if recipe.output.loss_curve:
            report.loss_curve(run)
        if recipe.output.report:  # the finished run's page: summary.json and final/ are written now
            write_live_report(run)
    return result


def final_eval(trainer) -> dict:
    """The eval at the end of training: the one the Trainer just ran at the last step (eval.strategy steps/epoch
    landing there), else a fresh one; never the same eval twice (one row per eval in metrics.jsonl)."""
    step = trainer.state.global_step
    for entry in reversed(trainer.state.log_history):
        if entry.get("step") != step:
            break
        if "eval_loss" in entry:
            return {k: v for k, v in entry.items() if k != "step"}
    return trainer.evaluate()


def _generation_metrics(plan: Plan, trainer, tok, console) -> dict:
    """Evaluation by generation at the end of training (eval.generate), logged into metrics.jsonl.

    Greedy decoding of a sharded model needs every rank in step; it runs in single-process runs, and
    `ftune eval` computes the same metrics for any run."""
    from ftune import generation

    if plan.world_size > 1:
        if console:
            console.print("[yellow]eval.generate[/yellow]: skipped in a multi-process run; `ftune eval` computes it")
        return {}
    section = plan.recipe.eval.generate
    fmt = generation.prompt_format(plan, tok)
    metrics = generation.generation_metrics(
        trainer.model, tok, trainer.eval_dataset, metrics=plan.generate_metrics or [],
        max_new_tokens=section.max_new_tokens, max_samples=section.max_samples,
        stop_ids=generation.stop_token_ids(tok, fmt), batch_size=trainer.args.per_device_eval_batch_size,
        predictions=plan.run.predictions, log=console.print if console and not console.is_terminal else None,
        pixels=_pixels(plan, trainer))
    trainer.log(metrics)
    return metrics


def _pixels(plan: Plan, trainer):
    """A vision-language run's image inputs for generation (the collator's processor and image settings)."""
    from ftune.datastage.vision_chat import VisionCollator, pixel_inputs

    collate = trainer.data_collator
    if not isinstance(collate, VisionCollator):
        return None
    return lambda paths, ids: pixel_inputs(collate.processor, paths, collate.images, ids)


def _write_error(run: RunDir, payload: dict) -> None:
    """error.json for the launcher (atomic). Where it can't be written (a full disk), the message goes to stderr."""
    if int(os.environ.get("RANK", "0")) != 0 and run.error.exists():
        return
    try:
        write_json_atomic(run.error, payload)
    except OSError as err:
        print(f"ftune worker: error: {payload['message']}" + (f"\n    hint: {payload['hint']}" if payload["hint"]
              else "") + f"\n    (could not write {run.error}: {err.strerror})", file=sys.stderr)


def load_plan(path: str) -> Plan:
    """The Plan this worker was launched with: plan.json's sha256 must match the launcher's (a plan rewritten
    since, by another run into the same dir, is refused)."""
    data = Path(path).read_bytes()
    want = os.environ.get(PLAN_DIGEST_ENV)
    if want and hashlib.sha256(data).hexdigest() != want:
        raise FtuneError(f"{path} changed after this run was launched (another process rewrote it)",
                         hint="only one ftune run may use a run dir at a time; rerun the command")
    return Plan.model_validate_json(data)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    die_with_parent()  # ftune (and accelerate) gone: no orphan keeps training
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the launcher's accelerate ignores Ctrl-C; we don't
    STOP.install()
    try:
        plan = load_plan(argv[0])
    except FtuneError as err:
        print(f"ftune worker: error: {err.message}\n    hint: {err.hint}", file=sys.stderr)
        return err.exit_code
    if not plan.uses_bitsandbytes:  # transformers and peft import it whenever installed: ~1.5 s of every start
        sys.modules.setdefault("bitsandbytes", None)  # find_spec → None: both treat it as absent
    run = plan.run
    debug = os.environ.get("FTUNE_DEBUG") == "1"
    try:
        try:
            run_stages(plan)
            distributed.close(plan)
        except Terminated:
            raise terminated_error(None, None) from None
        except Exception as err:  # noqa: BLE001 - a full disk, or a peer rank that stopped: user-facing errors
            known = (disk_full(err, run.root) if isinstance(err, OSError) else None) or distributed.peer_stopped(
                err, plan)
            if known is None:
                raise
            raise known from err
        return 0
    except FtuneError as err:
        problems = [{"path": p.path, "message": p.message, "hint": p.hint, "severity": p.severity}
                    for p in getattr(err, "problems", [])]  # a RecipeError's: located by the parent, at its keys
        _write_error(run, {"kind": "user", "message": err.message, "hint": err.hint,
                               "exit_code": err.exit_code, "traceback": traceback.format_exc(),
                               **({"problems": problems} if problems else {})})
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


def stop_at_max_steps(trainer) -> None:
    """Train no step past max_steps when resuming. transformers 5.23 resumes a checkpoint taken at max_steps (a
    run stopped after its last checkpoint, before final/) into its epoch loop, which trains one more step before
    it checks max_steps: checkpoint-4 of a 4-step run became a 5-step run. Each epoch now starts only below
    max_steps, so such a resume loads the checkpoint and goes straight to the save."""
    run_epoch = trainer._run_epoch

    def run_epoch_below_max(*args, **kwargs):
        state = trainer.state
        if state.max_steps > 0 and state.global_step >= state.max_steps:
            trainer.control.should_training_stop = True
            return None
        return run_epoch(*args, **kwargs)

    trainer._run_epoch = run_epoch_below_max
