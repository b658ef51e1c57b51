"""Run lm-eval harness tasks on a model held in memory (heavy: imports lm_eval, torch, transformers).

The harness's `hf` model class (`HFLM`) wraps the model and tokenizer as they are: during a run that is the
training model with its adapters active (no merge, no reload); after training, the model `ftune eval` loaded. The
numbers are the harness's own (`simple_evaluate`), so they equal a standalone `lm_eval` run of the same model.
"""

from __future__ import annotations

import time
from functools import lru_cache

from ftune.benchmarks import BenchmarkPlan
from ftune.errors import FtuneError

Scores = dict[str, dict[str, float]]
"""task → {metric: value, metric_stderr: value}; a metric under a filter other than the harness's `none` keeps
the harness's spelling, `exact_match,strict-match`."""


def scores(results: dict) -> Scores:
    """The harness's `results` block ({task: {"acc,none": v, "acc_stderr,none": v, "alias": ...}}) as numbers by
    metric, the `,none` filter suffix dropped; values the harness could not compute ("N/A") are left out."""
    out: Scores = {}
    for task, row in results.items():
        metrics: dict[str, float] = {}
        for key, value in row.items():
            if "," not in key or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            metric, filt = key.split(",", 1)
            metrics[metric if filt == "none" else key] = float(value)
        if metrics:
            out[task] = metrics
    return out


def run(model, tok, bench: BenchmarkPlan, *, tasks: list[str] | None = None) -> tuple[Scores, float]:
    """Evaluate `bench`'s tasks (or `tasks`) on `model` as it is; returns the scores and the seconds it took.

    The harness sees one process (an initialized model passed to HFLM is never sharded by it): under DDP or FSDP
    every rank calls this with the same rows, so the ranks' forward passes (and FSDP's gathers) stay in step, and
    each computes the same numbers; rank 0 writes them. Global random states are left alone (the harness would
    reseed Python, NumPy and torch, which changes a run's training after a measurement); few-shot sampling keeps
    its own seeded sampler. The model's train/eval mode is restored."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from ftune.quiet import quiet_libraries

    quiet_libraries()
    _quiet_harness()
    was_training = model.training
    start = time.perf_counter()
    try:
        lm = HFLM(pretrained=model, tokenizer=tok, batch_size=bench.batch_size)
        manager = _manager(tuple(bench.include), _all_local(bench, tasks))
        out = lm_eval.simple_evaluate(model=lm, tasks=list(tasks or bench.tasks), num_fewshot=bench.num_fewshot,
                                      limit=bench.limit, task_manager=manager, log_samples=False,
                                      random_seed=None, numpy_random_seed=None, torch_random_seed=None)
    except (KeyError, ValueError, FileNotFoundError) as err:  # an unknown task, a data file gone since validate
        raise FtuneError(f"lm-eval could not run {', '.join(tasks or bench.tasks)}: {err}",
                         hint="check the names with `ftune validate --check-paths RECIPE`") from err
    finally:
        model.train(was_training)
    return scores((out or {}).get("results", {})), time.perf_counter() - start


def _all_local(bench: BenchmarkPlan, tasks: list[str] | None) -> bool:
    from pathlib import Path

    from ftune.benchmarks import local_tasks

    local: set[str] = set()
    for folder in bench.include:
        local |= set(local_tasks(Path(folder)))
    return set(tasks or bench.tasks) <= local


@lru_cache(maxsize=4)
def _manager(include: tuple[str, ...], only_local: bool):
    """The harness's task index, built once per process: indexing its ~14,600 built-in YAMLs took 20-30 s on the
    loaded 2-core machine, every measurement. When every task comes from the include folders, the built-ins are
    not indexed at all."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=list(include) or None, include_defaults=not only_local)


def _quiet_harness() -> None:
    """The harness logs each request batch, warns about the initialized model we mean to pass, draws a progress bar
    per stage and asks git for a commit hash (a `fatal: not a git repository` line outside one); ftune prints its
    own lines. Its errors still show; `--verbose` (FTUNE_VERBOSE=1) leaves it all on."""
    import logging

    from ftune.quiet import verbose

    if verbose():
        return
    import importlib

    import tqdm

    for name in ("lm_eval", "lm-eval"):
        logging.getLogger(name).setLevel(logging.ERROR)
    def silent(*args, **kwargs):  # the harness passes `disable=` itself (False on rank 0): overridden
        return tqdm.tqdm(*args, **{**kwargs, "disable": True})

    for module in ("lm_eval.models.huggingface", "lm_eval.api.task", "lm_eval.api.model"):  # `from tqdm import tqdm`
        mod = importlib.import_module(module)
        if getattr(mod, "tqdm", None) is tqdm.tqdm:
            mod.tqdm = silent
    utils = importlib.import_module("lm_eval.loggers.utils")
    if hasattr(utils, "get_git_commit_hash"):
        utils.get_git_commit_hash = lambda: None
    evaluator = importlib.import_module("lm_eval.evaluator")
    if hasattr(evaluator, "get_git_commit_hash"):
        evaluator.get_git_commit_hash = lambda: None
