"""A CPU-time probe for any HF Trainer process, ftune's worker or a plain script alike (docs/performance.md, #30).

Put this folder on PYTHONPATH and set CPU_PROBE_DIR (and CPU_PROBE_TAG, the file name): each `Trainer.train` in
that process (and its children: `ftune run` hands PYTHONPATH to the worker) writes `<tag>.json` with the step's
CPU time (`training_step`, median after the first 10 steps), the batch fetch, each log, the garbage collector,
page faults, the threads, TrainingArguments and the model's settings. `CPU_PROBE_PROFILE=1` also writes
`<tag>.prof`, cProfile with a CPU clock over the whole loop. CPU time, not wall time: on a busy machine a step's
wall time is mostly waiting for a core. Nothing here runs unless CPU_PROBE_DIR is set; when it is, every Python
process started with this PYTHONPATH imports transformers' Trainer at start (slower start-up, e.g. in `ftune run`'s
parent, which then also prints bitsandbytes' import warnings; the training loop is not affected).
"""

import os

if os.environ.get("CPU_PROBE_DIR"):
    import gc
    import json
    import resource
    import statistics
    import time

    import transformers.trainer as _trainer

    _OUT, _TAG = os.environ["CPU_PROBE_DIR"], os.environ.get("CPU_PROBE_TAG", f"pid{os.getpid()}")
    _T = _trainer.Trainer
    _cpu: dict = {"step": [], "fetch": [], "log": []}

    def _timed(name, fn):
        def wrapper(self, *args, **kwargs):
            c0 = time.process_time()
            try:
                return fn(self, *args, **kwargs)
            finally:
                _cpu[name].append(time.process_time() - c0)
        return wrapper

    _T.training_step = _timed("step", _T.training_step)
    _T.get_batch_samples = _timed("fetch", _T.get_batch_samples)
    _T.log = _timed("log", _T.log)
    _train = _T.train

    def _threads() -> list[str]:
        return sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))

    def train(self, *args, **kwargs):
        import torch

        collections = {0: [0, 0.0], 1: [0, 0.0], 2: [0, 0.0]}
        started = {}

        def on_gc(phase, info):
            if phase == "start":
                started["c"] = time.process_time()
            else:
                entry = collections[info["generation"]]
                entry[0] += 1
                entry[1] += time.process_time() - started["c"]

        gc.callbacks.append(on_gc)
        profile = None
        if os.environ.get("CPU_PROBE_PROFILE") == "1":
            import cProfile

            profile = cProfile.Profile(time.process_time)
            profile.enable()
        r0, c0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
        try:
            return _train(self, *args, **kwargs)
        finally:
            loop_cpu = time.process_time() - c0
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            if profile is not None:
                profile.disable()
                profile.dump_stats(f"{_OUT}/{_TAG}.prof")
            gc.callbacks.remove(on_gc)
            steps = _cpu["step"]
            record = {
                "steps": len(steps),
                "loop_cpu_s": round(loop_cpu, 4),
                "step_cpu_median_ms": round(statistics.median(steps[10:]) * 1e3, 3) if len(steps) > 10 else None,
                "first_steps_cpu_ms": [round(x * 1e3, 1) for x in steps[:3]],
                "fetch_cpu_s": round(sum(_cpu["fetch"]), 4),
                "log_cpu_ms": [round(x * 1e3, 3) for x in _cpu["log"]],
                "gc": {g: {"collections": n, "cpu_s": round(s, 4)} for g, (n, s) in collections.items()},
                "minor_faults": r1.ru_minflt - r0.ru_minflt,
                "threads": _threads(),
                "torch_threads": [torch.get_num_threads(), torch.get_num_interop_threads()],
                "env": {k: v for k, v in os.environ.items() if k.startswith(("OMP_", "KMP_", "MKL_", "ATEN_"))},
                "args": {k: str(v) for k, v in self.args.to_dict().items()},
                "model": {"class": type(self.model).__name__, "dtype": str(self.model.dtype),
                          "attn": str(getattr(self.model.config, "_attn_implementation", None)),
                          "use_cache": getattr(self.model.config, "use_cache", None),
                          "anomaly": torch.is_anomaly_enabled(),
                          "deterministic": torch.are_deterministic_algorithms_enabled()},
                "callbacks": [type(c).__name__ for c in self.callback_handler.callbacks],
            }
            os.makedirs(_OUT, exist_ok=True)
            with open(f"{_OUT}/{_TAG}.json", "w") as f:
                json.dump(record, f, indent=1)

    _T.train = train
