"""Developer instrumentation: a torch profiler over a few training steps (`FTUNE_PROFILE=DIR`).

Off unless the environment asks for it. With `FTUNE_PROFILE=DIR`, steps 6-8 (after 4 untimed and 1 warm-up step) are
profiled on CPU and, where present, CUDA; rank 0 writes `DIR/profile.txt` (the top operators by self time, each
device), `DIR/steps.json` (wall seconds of every step, synchronised on CUDA, and
the input shape of every forward) and `DIR/args.json` (the
TrainingArguments, parameter dtypes and thread count). bench/gpu.py uses the same callback
for its plain Trainer script, so both sides of a speed comparison are profiled the same way.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

ENV_FLAG = "FTUNE_PROFILE"


def enabled() -> bool:
    return bool(os.environ.get(ENV_FLAG))


def callback(rank: int = 0):
    """A TrainerCallback that profiles steps 6-8 and times every step (None when profiling is off)."""
    if not enabled():
        return None
    import torch
    from transformers import TrainerCallback

    folder = Path(os.environ[ENV_FLAG])
    cuda = torch.cuda.is_available()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])

    class StepProfiler(TrainerCallback):
        def __init__(self):
            self.prof = torch.profiler.profile(activities=activities,
                                               schedule=torch.profiler.schedule(wait=4, warmup=1, active=3, repeat=1))
            self.times: list[float] = []
            self.shapes: list[list[int]] = []  # the input_ids shape of each forward: which batches were slow
            self.t0 = 0.0

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self.prof.start()
            if model is not None:
                model.register_forward_pre_hook(self._shape, with_kwargs=True)
            if rank == 0:  # what each side really trains with, to diff two runs' settings
                folder.mkdir(parents=True, exist_ok=True)
                dtypes = sorted({f"{p.dtype}/{p.requires_grad}" for p in model.parameters()}) if model else []
                (folder / "args.json").write_text(json.dumps(
                    {"args": args.to_dict(), "param_dtypes": dtypes, "model": type(model).__name__,
                     "threads": torch.get_num_threads()}, indent=1, default=str))

        def _shape(self, module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is not None and hasattr(ids, "shape"):
                self.shapes.append(list(ids.shape))

        def on_step_begin(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            self.times.append(time.perf_counter() - self.t0)
            self.prof.step()

        def on_train_end(self, args, state, control, **kwargs):
            self.prof.stop()
            if rank != 0:
                return
            folder.mkdir(parents=True, exist_ok=True)
            table = self.prof.key_averages()
            text = [table.table(sort_by="self_cpu_time_total", row_limit=45)]
            if cuda:
                text.append(table.table(sort_by="self_cuda_time_total", row_limit=45))
            (folder / "profile.txt").write_text("\n\n".join(text))
            (folder / "steps.json").write_text(json.dumps({"step_seconds": self.times, "input_shapes": self.shapes}))

    return StepProfiler()
