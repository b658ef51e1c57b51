"""What the worker shows and leaves behind on rank 0: header table, final summary, loss-curve PNG."""

from __future__ import annotations

import json
from pathlib import Path

from ftune import benchmarks
from ftune.rundir import RunDir, read_metrics


def header(console, plan, counts, bundle, quantization: str | None = None) -> None:
    from rich.table import Table

    r = plan.recipe
    table = Table(title=f"ftune run · {r.name}", show_header=False, title_justify="left")
    table.add_column(style="bold cyan")
    table.add_column()
    table.add_row("model", f"{r.model.path} ({r.model.task}, {plan.model_load.kwargs['dtype']})")
    table.add_row("method", r.peft.method + (f" · {r.kbit.bits}-bit" if r.kbit else "")
                  + (f" · continuing {plan.model_load.adapter}" if plan.model_load.adapter else ""))
    if quantization:
        table.add_row("quantized", quantization)
    table.add_row("parameters", f"{counts.trainable:,} trainable / {counts.total:,} total ({counts.percent:.4f}%)")
    if bundle.report.streaming:
        table.add_row("data", f"streamed from {bundle.report.stream_files} file(s), not counted"
                      + (f"; eval from {bundle.report.stream_eval_files}" if bundle.report.stream_eval_files else ""))
    else:
        table.add_row("data", f"{len(bundle.train):,} train rows"
                      + (f", {len(bundle.eval):,} eval" if bundle.eval is not None else ""))
    t = plan.trainer  # what runs, as the Plan gives it to the trainer
    dp = plan.parallelism.dp if plan.parallelism is not None else plan.world_size
    ranks = f"{dp} process{'es' if dp != 1 else ''}" if dp == plan.world_size else f"{dp} data-parallel rank(s)"
    table.add_row("batch", f"{plan.effective_batch_size} effective = {t['per_device_train_batch_size']} per device "
                  f"× {t['gradient_accumulation_steps']} accumulation × {ranks}")
    steps = f"{t['max_steps']} max steps" if t["max_steps"] > 0 else f"{t['num_train_epochs']:g} epochs"
    table.add_row("schedule", f"{steps}, lr {t['learning_rate']:g} ({t['lr_scheduler_type']}), seed {t['seed']}")
    strategy = f" ({r.distributed.strategy})" if r.distributed.strategy != "none" else ""
    table.add_row("devices", f"{plan.world_size} × {plan.device}{strategy}, precision {plan.mixed_precision}")
    if plan.cpu_threads is not None:
        table.add_row("threads", plan.cpu_threads.describe())
    if plan.benchmarks is not None:  # eval.benchmarks: what each measurement runs
        b = plan.benchmarks
        table.add_row("benchmarks", f"{', '.join(b.tasks)} at {', '.join(b.at)}"
                      + (f", {b.limit} rows per task" if b.limit else ", every row") + " (lm-eval harness)")
    table.add_row("run dir", plan.run_dir)
    if plan.resume_from:
        table.add_row("resume", plan.resume_from)
    console.print(table)
    for note in plan.notes:
        console.print(f"[dim]note: {note}[/dim]")


def summary(console, plan, final_metrics: dict, saved: dict, tokens_per_step: float = 0.0) -> dict:
    """The end-of-run lines and summary.json: losses, eval metrics, throughput (tokens/s from the data stage's
    mean tokens per row) and, on CUDA, the peak GPU memory allocated."""
    run = plan.run
    records = read_metrics(run)
    losses = [r["loss"] for r in records if "loss" in r]
    evals = [r["eval_loss"] for r in records if "eval_loss" in r]
    speed = next((r for r in reversed(records) if "train_steps_per_second" in r), {})
    result = {
        "first_loss": losses[0] if losses else None,
        "final_loss": losses[-1] if losses else None,
        "best_eval_loss": min(evals) if evals else None,
        "tokens_per_second": round(speed["train_steps_per_second"] * tokens_per_step) if speed else None,
        "peak_memory_bytes": _peak_memory(plan),
        **rl_times(records),
        **{k: v for k, v in final_metrics.items() if isinstance(v, (int, float))},
    }
    if (bench := benchmarks.summary(records)) is not None:  # eval.benchmarks: start, end, best, change
        result["benchmarks"] = bench
    lines = ["[bold green]done[/bold green]"]
    if losses:
        lines.append(loss_line(records))
    if "eval_loss" in final_metrics:  # perplexity as the trainer's log added it (plan.evaluation.with_perplexity)
        ppl = f" (perplexity {final_metrics['eval_perplexity']:.2f})" if "eval_perplexity" in final_metrics else ""
        lines.append(f"eval loss {final_metrics['eval_loss']:.4f}{ppl}, best {min(evals):.4f}")
    for key in ("eval_accuracy", "eval_f1", "eval_rewards/accuracies", "eval_rewards/margins"):
        if key in final_metrics and "eval_generated" not in final_metrics:
            lines.append(f"{key[5:]} {final_metrics[key]:.4f}")
    if "eval_generated" in final_metrics:  # evaluation by generation (eval.generate)
        scores = ", ".join(f"{k[5:]} {final_metrics[k]:.4f}" for k in ("eval_exact_match", "eval_f1") if k in final_metrics)
        lines.append(f"generation ({final_metrics['eval_generated']} greedy answers): {scores}, "
                     f"stopped {final_metrics['eval_stopped']:.0%}")
    if bench is not None and bench["change"]:
        lines += [f"benchmark {task}/{m}: {bench['start'][task][m]:.4f} -> {bench['end'][task][m]:.4f} ({d:+.4f})"
                  for task, metrics in bench["change"].items() for m, d in metrics.items()]
    lines.append(f"final/  {run.final}  ({'adapter' if saved.get('adapter') else 'model'}, "
                 f"{saved.get('tensors', 0)} tensors, verified)")
    lines.append(f"metrics {run.metrics}")
    console.print("\n".join(lines), soft_wrap=True)  # a log file gets whole lines, not 80-column pieces
    run.summary.write_text(json.dumps(result, indent=2) + "\n")
    return result


def rl_times(records: list[dict]) -> dict:
    """Online RL's totals over the run from its per-step means (`ftune.runtime.rl.TIMES`, each the mean over its
    logging window): seconds generating, seconds training, completion tokens and their rate over both."""
    totals = {"generation_time": 0.0, "training_time": 0.0, "generated_tokens": 0.0}
    last, seen = 0, False
    for r in records:  # a window ends at its logged step and starts after the previous log (a resumed run's
        if "generation_time" not in r:  # repeated steps count once)
            continue
        steps, last, seen = max(r["step"] - last, 0), max(r["step"], last), True
        for key in totals:
            totals[key] += r.get(key, 0.0) * steps
    if not seen:
        return {}
    seconds = totals["generation_time"] + totals["training_time"]
    return {"generation_seconds": round(totals["generation_time"], 3),
            "training_seconds": round(totals["training_time"], 3),
            "generated_tokens": round(totals["generated_tokens"]),
            "generated_tokens_per_second": round(totals["generated_tokens"] / seconds, 2) if seconds > 0 else None}


def loss_line(records: list[dict]) -> str:
    """The train loss at the start and at the end, each the mean over its logging window (what the Trainer logs),
    labelled with the steps it covers, so it is not read as the loss of the final model."""
    steps = [r["step"] for r in records if "loss" in r]
    losses = [r["loss"] for r in records if "loss" in r]

    def window(k: int) -> str:
        start = steps[k - 1] + 1 if k else 1
        return f"step {start}" if start == steps[k] else f"steps {start}–{steps[k]}"

    if len(losses) == 1:
        return f"train loss {losses[0]:.4f} (mean over {window(0)})"
    return (f"train loss {losses[0]:.4f} ({window(0)}) → {losses[-1]:.4f} (last logging window, "
            f"{window(len(losses) - 1)})")


def _peak_memory(plan) -> int | None:
    if plan.device != "cuda":
        return None
    import torch

    return int(torch.cuda.max_memory_allocated())


def loss_curve(run: RunDir) -> Path | None:
    records = read_metrics(run)
    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    evals = [(r["step"], r["eval_loss"]) for r in records if "eval_loss" in r]
    if not train:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot(*zip(*train), label="train loss")
    if evals:
        ax.plot(*zip(*evals), "o-", label="eval loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(run.root.name)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = run.loss_curve
    fig.savefig(out)
    plt.close(fig)
    return out
