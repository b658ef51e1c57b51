"""Trainer callbacks: metrics.jsonl, checkpoint completion markers, the numerics guard, the SIGTERM stop,
and the rich progress bar.

They are factories returning TrainerCallback subclasses so this module imports transformers only
when a worker actually builds a trainer.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from ftune.clock import clock
from ftune.recipe.objectives import FAMILIES
from ftune.rundir import mark_complete
from ftune.worker.stop import STOP, is_finite, nonfinite


def metrics_line(record: dict) -> str:
    """One line of metrics.jsonl, strict JSON: a non-finite value is written as null and named, with what it was,
    under `nonfinite` (json.dumps would write a bare NaN, which strict readers such as jq refuse)."""
    bad = {k: repr(v) for k, v in record.items() if isinstance(v, float) and not math.isfinite(v)}
    if bad:
        record = {k: (None if k in bad else v) for k, v in record.items()} | {"nonfinite": bad}
    return json.dumps(record, allow_nan=False) + "\n"


def host_group(world_size: int):
    """A process group whose collectives run on the host: the default one when it is gloo (or holds gloo for CPU
    tensors), else a gloo group beside NCCL (made once, by every rank: `new_group` is collective). None: one
    process, or the default group."""
    if world_size <= 1:
        return None
    import torch.distributed as dist

    if not dist.is_initialized() or "gloo" in str(dist.get_backend()):
        return None
    return dist.new_group(backend="gloo")


def make_callbacks(plan, console=None, tokens_per_step: float = 0.0) -> list:
    """metrics.jsonl and checkpoint markers on every run; the progress bar on rank 0's console. `tokens_per_step`:
    the data stage's mean tokens per row x rows per optimizer step, for tok/s without counting tokens each step."""
    from transformers import TrainerCallback

    from ftune.worker.finite import first_nonfinite
    from ftune.worker.verify import verify_checkpoint

    run = plan.run

    class MetricsJsonl(TrainerCallback):
        """One JSON object per logged event (rank 0): step, epoch, and the metrics."""

        def __init__(self) -> None:
            self.path = run.metrics

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or not logs:
                return
            record = {"step": state.global_step, "epoch": state.epoch, "time": round(time.time(), 3)}
            record.update({k: v for k, v in logs.items() if isinstance(v, (int, float, str)) or
                           (isinstance(v, list) and all(isinstance(x, (int, float)) for x in v))})
            with self.path.open("a") as f:
                f.write(metrics_line(record))

    class CheckpointMarker(TrainerCallback):
        """Mark a checkpoint complete once the Trainer has written all of it (resume trusts only these)."""

        def on_save(self, args, state, control, model=None, **kwargs):
            if not state.is_world_process_zero:
                return
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            bad = first_nonfinite(model, trainable_only=plan.recipe.peft.uses_peft_library) if model else None
            if bad is not None:  # never a complete (resumable) checkpoint of non-finite weights
                raise nonfinite(f"parameter {bad}", state.global_step)
            if folder.is_dir():
                # A checkpoint that would restore nothing (or part of the model) is an error, never "complete".
                verify_checkpoint(folder, model, plan.recipe.peft.uses_peft_library)
                mark_complete(folder, {"step": state.global_step, "time": time.time()})

    class NumericsGuard(TrainerCallback):
        """Stop on a non-finite loss or gradient norm. Logged values are averaged over all processes, so every
        rank stops at the same step (plan.trainer turns off the Trainer's NaN filter, which showed NaN as 0)."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            for key in ("loss", "grad_norm", "train_loss"):
                if logs and key in logs and not is_finite(logs[key]):
                    raise nonfinite(key.replace("_", " "), state.global_step, logs[key])

    class StopOnSignal(TrainerCallback):
        """SIGTERM: save a checkpoint at the current step and stop (every rank agrees on the step). The ranks agree
        over a host (gloo) group: the flag reduced on the GPU and read on the host would wait for the step's GPU
        work every step, and the host could no longer queue the next step's kernels ahead."""

        group = None

        def on_train_begin(self, args, state, control, **kwargs):
            STOP.phase = "training"
            self.group = host_group(args.world_size)

        def on_step_end(self, args, state, control, **kwargs):
            requested = STOP.requested
            if args.world_size > 1:
                import torch
                import torch.distributed as dist

                flag = torch.tensor([int(requested)])  # on the host: no device work to wait for
                dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
                requested = bool(flag.item())
            if requested:
                STOP.signum = STOP.signum or 15
                control.should_save = True
                control.should_training_stop = True

        def on_train_end(self, args, state, control, **kwargs):
            STOP.phase = "finishing"

    class LiveReport(TrainerCallback):
        """output.report: report.html rewritten (atomically) after each log line, so a browser on a shared
        filesystem watches the run; after MetricsJsonl, so the page holds the line just logged."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero and logs:
                write_live_report(run, console)

    callbacks = [MetricsJsonl(), CheckpointMarker(), NumericsGuard(), StopOnSignal()]
    if plan.recipe.output.report:
        callbacks.append(LiveReport())
    if console is not None and console.is_terminal:
        callbacks.append(_rich_progress(TrainerCallback, console, tokens_per_step,
                                        preference=FAMILIES[plan.family].on_trl))
    elif console is not None:  # a log file, a pipe, CI, Slurm: no bar to redraw, one plain line per logging step
        callbacks.append(_plain_progress(TrainerCallback, console, tokens_per_step))
    return callbacks


def write_live_report(run, console=None) -> None:
    """The run's report.html now. A page that can't be written (a full disk, a bug in the page) is a warning
    printed once, never the end of a training run: the report is a view of files the run keeps writing."""
    from ftune.report import write_report

    try:
        write_report([run.root], run.report)
    except Exception as err:  # noqa: BLE001 - see the docstring
        if not getattr(write_live_report, "warned", False):
            write_live_report.warned = True  # type: ignore[attr-defined]
            print(f"ftune worker: warning: report.html not written: {type(err).__name__}: {err}", flush=True)


def progress_line(step: int, total: int, logs: dict, tokens_per_second: float, elapsed: float, done: int) -> str:
    """One plain progress line: step/total, loss, lr, tok/s, elapsed and the time left at this pace (`done`: steps
    taken in `elapsed`, fewer than `step` after a resume)."""
    eta = elapsed / done * (total - step) if done > 0 else 0.0
    parts = [f"train {step}/{total}"]
    if "loss" in logs:
        parts.append(f"loss {logs['loss']:.4f}")
    if "learning_rate" in logs:
        parts.append(f"lr {logs['learning_rate']:.2e}")
    parts += [f"{tokens_per_second:,.0f} tok/s", f"elapsed {clock(elapsed)}", f"eta {clock(eta)}"]
    return "  ".join(parts)


def _plain_progress(base, console, tokens_per_step: float):
    class PlainProgress(base):
        """Rank 0, stdout not a terminal: a line per logged training loss, and the eval lines."""

        def __init__(self) -> None:
            self.t0 = 0.0
            self.step0 = 0

        def on_train_begin(self, args, state, control, **kwargs):
            self.t0 = time.time()
            self.step0 = state.global_step

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or not logs:
                return
            elapsed = max(time.time() - self.t0, 1e-6)
            if "loss" in logs:
                done = state.global_step - self.step0
                console.print(progress_line(state.global_step, state.max_steps, logs, done * tokens_per_step / elapsed,
                                            elapsed, done), highlight=False, soft_wrap=True)
            elif "eval_loss" in logs:
                console.print(f"  step {state.global_step}: eval_loss {logs['eval_loss']:.4f}", highlight=False)

    return PlainProgress()


def _rich_progress(base, console, tokens_per_step: float, preference: bool = False):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    class RichProgress(base):
        """Progress bar on rank 0 with loss, learning rate and tokens/s."""

        def __init__(self) -> None:
            self.progress = None
            self.task = None
            self.t0 = 0.0
            self.step0 = 0
            self.fields = {"loss": "-", "lr": "-", "tps": "-"}
            self.last_refresh = 0.0

        def on_train_begin(self, args, state, control, **kwargs):
            if not state.is_world_process_zero:
                return
            self.progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TextColumn("loss {task.fields[loss]}  lr {task.fields[lr]}  {task.fields[tps]} tok/s"),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=console,
                transient=False,
                auto_refresh=False,  # no 10 Hz refresh thread competing with training for the cores
            )
            self.progress.start()
            self.task = self.progress.add_task("train", total=state.max_steps, completed=state.global_step,
                                               **self.fields)
            self.t0 = time.time()
            self.step0 = state.global_step

        def on_step_end(self, args, state, control, **kwargs):
            if self.progress is not None:
                elapsed = max(time.time() - self.t0, 1e-6)
                self.fields["tps"] = f"{(state.global_step - self.step0) * tokens_per_step / elapsed:,.0f}"
                self.progress.update(self.task, completed=state.global_step, **self.fields)
                now = time.time()
                if now - self.last_refresh >= 0.5 or state.global_step == state.max_steps:
                    self.progress.refresh()
                    self.last_refresh = now

        def on_log(self, args, state, control, logs=None, **kwargs):
            if self.progress is None or not logs:
                return
            if "loss" in logs:
                self.fields["loss"] = f"{logs['loss']:.4f}"
            if "learning_rate" in logs:
                self.fields["lr"] = f"{logs['learning_rate']:.2e}"
            if "eval_loss" in logs and preference:  # a preference loss has no perplexity
                self.progress.console.print(
                    f"  step {state.global_step}: eval_loss {logs['eval_loss']:.4f}"
                    + "".join(f"  {k.removeprefix('eval_')} {v:.4f}" for k, v in logs.items()
                              if k in ("eval_rewards/accuracies", "eval_rewards/margins"))
                )
            elif "eval_loss" in logs:  # perplexity where the trainer's log added it (plan.evaluation.with_perplexity)
                ppl = f"  perplexity {logs['eval_perplexity']:.2f}" if "eval_perplexity" in logs else ""
                self.progress.console.print(
                    f"  step {state.global_step}: eval_loss {logs['eval_loss']:.4f}{ppl}"
                    + "".join(f"  {k} {v:.4f}" for k, v in logs.items()
                              if k.startswith("eval_") and k in ("eval_accuracy", "eval_f1"))
                )

        def on_train_end(self, args, state, control, **kwargs):
            if self.progress is not None:
                self.progress.update(self.task, completed=state.global_step, **self.fields)
                self.progress.refresh()
                self.progress.stop()
                self.progress = None

    return RichProgress()
