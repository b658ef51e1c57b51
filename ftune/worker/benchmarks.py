"""eval.benchmarks during a run: lm-eval harness tasks on the live model (adapters active, no merge, no reload) at
the start (before step 1), at each eval (`steps`) and at the end, as `Plan.benchmarks` says.

Every rank measures (the same rows, so FSDP's gathers stay in step; `ftune.benchmarks.harness.run`); rank 0 writes
one metrics.jsonl row per measurement: `bench/<task>/<metric>` at its step, with `bench_at` and `bench_seconds`.
summary.json's `benchmarks` is read back from those rows (`ftune.benchmarks.summary`), so a resumed run keeps its
start measurement.
"""

from __future__ import annotations

import time


def make_callback(plan, tok, console=None):
    """The TrainerCallback that measures, or None when the recipe has no eval.benchmarks."""
    bench = plan.benchmarks
    if bench is None:
        return None
    from transformers import TrainerCallback

    from ftune.benchmarks import flat
    from ftune.benchmarks.harness import run
    from ftune.worker.callbacks import metrics_line
    from ftune.worker.stop import STOP

    class Benchmarks(TrainerCallback):
        def __init__(self) -> None:
            self.measured: set[int] = set()  # steps: the end's eval and a last `steps` eval are one measurement

        def _measure(self, label: str, state, model) -> None:
            if state.global_step in self.measured or model is None:
                return
            self.measured.add(state.global_step)
            if console:
                console.print(f"benchmarks ({label}, step {state.global_step}): {', '.join(bench.tasks)}"
                              + (f", {bench.limit} rows each" if bench.limit else ""))
            scores, seconds = run(model, tok, bench)
            if not state.is_world_process_zero:
                return
            record = {"step": state.global_step, "epoch": state.epoch, "time": round(time.time(), 3),
                      "bench_at": label, "bench_seconds": round(seconds, 3), **flat(scores)}
            with plan.run.metrics.open("a") as f:
                f.write(metrics_line(record))
            if console:
                for task, metrics in scores.items():
                    shown = ", ".join(f"{m} {v:.4f}" for m, v in metrics.items() if "_stderr" not in m)
                    console.print(f"  {task}: {shown}  ({seconds:.1f}s)")

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            if "start" in bench.at and state.global_step == 0:  # a resumed run measured its start already
                self._measure("start", state, model)

        def on_evaluate(self, args, state, control, model=None, **kwargs):
            if "steps" in bench.at and state.global_step > 0:  # not eval.on_start's (that is `start`)
                self._measure("steps", state, model)

        def on_train_end(self, args, state, control, model=None, **kwargs):
            if "end" in bench.at and not STOP.requested:  # a stopped run's end is not the end
                self._measure("end", state, model)

    return Benchmarks()
