"""Benchmarks through EleutherAI's lm-eval harness: which task names exist, and the checks on `eval.benchmarks`.

Light (no torch, no lm_eval import: `import lm_eval.tasks` pulls datasets, numpy and the harness's registry, seconds
of `validate`): the installed harness's task, group and tag names are read from its task YAMLs by hand (top-level
`task:` / `group:` / `tag:` keys), and the include folders' YAMLs with PyYAML, their `!function` tags ignored.
Running a task on a model is `ftune.benchmarks.harness` (heavy), for the worker and `ftune eval`.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict

from ftune.errors import Problem

INSTALL = 'pip install "ftune[eval]"'
"""The install line of the harness (lm-eval 0.4.x, the `eval` extra)."""
PACKAGE = "lm_eval"
KEY = "eval.benchmarks"


@dataclass(frozen=True)
class LocalTask:
    """A task (or group) an include folder's YAML defines, and the data files it reads."""

    name: str
    yaml: Path
    data_files: tuple[str, ...] = ()


class BenchmarkPlan(BaseModel):
    """`eval.benchmarks` as a run carries it out (`Plan.benchmarks`): include folders absolute, the batch size
    decided (the eval batch size), when to measure."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tasks: list[str]
    include: list[str] = []
    """Absolute folders of local task YAMLs (the harness's `include_path`)."""
    num_fewshot: int | None = None
    limit: int | None = None
    at: list[str] = ["start", "end"]
    batch_size: int = 8


def plan(bench, recipe_dir: Path, batch_size: int) -> BenchmarkPlan | None:
    """The recipe's `eval.benchmarks` → what the run (or `ftune eval`) carries out; None without it."""
    if bench is None:
        return None
    return BenchmarkPlan(tasks=list(bench.tasks), include=[str(f) for f in include_folders(bench.include, recipe_dir)],
                         num_fewshot=bench.num_fewshot, limit=bench.limit, at=list(bench.at), batch_size=batch_size)


def harness_installed() -> bool:
    return importlib.util.find_spec(PACKAGE) is not None


_TOP_KEY = re.compile(r"^[\"']?(task|group|tag)[\"']?:[ \t]*(.*)$")
_LIST_ITEM = re.compile(r"^[ \t]+-[ \t]*(\S+)")


def _names_in(text: str) -> set[str]:
    """The names a harness task YAML defines or lists at its top level: `task: x`, `group: x`, `tag: x` or
    `tag: [x, y]` / a block list under `tag:` (a group's `task:` list names tasks too)."""
    names: set[str] = set()
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _TOP_KEY.match(line)
        if not m:
            continue
        value = m.group(2).split("#")[0].strip().strip("'\"")
        if value.startswith("["):
            names |= {v.strip().strip("'\"") for v in value.strip("[]").split(",") if v.strip()}
        elif value and not value.startswith(("!", "{", "&", "*")):
            names.add(value)
        elif not value:
            for follow in lines[i + 1:]:
                item = _LIST_ITEM.match(follow)
                if item is None:
                    break
                names.add(item.group(1).strip("'\""))
    return {n for n in names if re.fullmatch(r"[\w.\-/()]+", n) and n != "null"}


def _task_files() -> list[Path]:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return []
    root = Path(next(iter(spec.submodule_search_locations))) / "tasks"
    # `x.yaml`, and the templates tasks include (`_x_yaml`, `_x_template`: tags are set there)
    return sorted(p for p in root.rglob("*") if p.suffix in (".yaml", ".yml", "") and p.is_file())


@lru_cache(maxsize=1)
def _texts() -> tuple[str, ...]:
    texts = []
    for path in _task_files():
        try:
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
    return tuple(texts)


@lru_cache(maxsize=1)
def installed_names() -> frozenset[str]:
    """The task, group and tag names the installed harness's task YAMLs define at their top level (empty without
    it): a read of its ~14,000 YAMLs, no import of lm_eval (measured on 0.4.13: 14,634 of the 14,683 names its
    TaskManager lists; the rest are groups defined inside another group's list, which `known` finds)."""
    names: set[str] = set()
    for text in _texts():
        names |= _names_in(text)
    return frozenset(names)


def known(name: str) -> bool:
    """Whether the installed harness defines `name`: a top-level name, else a name its YAMLs define as a value
    anywhere (a group nested in another group's `task:` list)."""
    if name in installed_names():
        return True
    value = re.compile(r"(?:^|[\s:\-\[,])[\"']?" + re.escape(name) + r"[\"']?[ \t]*(?:$|[,\]#])", re.MULTILINE)
    return any(name in text and value.search(text) for text in _texts())


class _TolerantLoader(yaml.SafeLoader):
    """Reads lm-eval task YAMLs without running them: `!function utils.x` becomes its text."""


_TolerantLoader.add_multi_constructor("!", lambda loader, suffix, node: f"!{suffix}")


def _data_files(cfg: dict) -> tuple[str, ...]:
    files = (cfg.get("dataset_kwargs") or {}).get("data_files") if isinstance(cfg.get("dataset_kwargs"), dict) else None
    if isinstance(files, str):
        return (files,)
    if isinstance(files, list):
        return tuple(str(f) for f in files)
    if isinstance(files, dict):
        out: list[str] = []
        for value in files.values():
            out += [value] if isinstance(value, str) else [str(v) for v in value or []]
        return tuple(out)
    return ()


def local_tasks(folder: Path) -> dict[str, LocalTask]:
    """The tasks and groups the YAMLs under `folder` define (`task:` / `group:` names), as the harness's
    `include_path` reads them."""
    found: dict[str, LocalTask] = {}
    try:
        files = sorted(folder.rglob("*.yaml"))
    except OSError:  # an unreadable folder below: the names it holds can't be known
        files = []
    for path in files:
        try:
            cfg = yaml.load(path.read_text(encoding="utf-8"), Loader=_TolerantLoader)  # noqa: S506 - safe loader
        except (OSError, yaml.YAMLError):
            continue
        if not isinstance(cfg, dict):
            continue
        for key in ("task", "group"):
            name = cfg.get(key)
            if isinstance(name, str):
                found.setdefault(name, LocalTask(name, path, _data_files(cfg) if key == "task" else ()))
    return found


def include_folders(include: list[str], recipe_dir: Path) -> list[Path]:
    """`eval.benchmarks.include`, each relative to the recipe file, absolute."""
    return [Path(os.path.abspath(recipe_dir / folder)) for folder in include]


def _is_dir(folder: Path) -> bool:
    try:
        return folder.is_dir()
    except (OSError, ValueError):  # a NUL byte, a name too long: no such folder
        return False


def problems(bench, recipe_dir: Path, *, check_paths: bool, need_harness: bool) -> list[Problem]:
    """`eval.benchmarks`' checks, one wording for `validate` and the compiler: the harness installed
    (`need_harness`: the compiler), include folders and their tasks' data files (`check_paths`), and every task
    name known to the harness or an include folder, with did-you-mean."""
    if bench is None:
        return []
    found: list[Problem] = []
    installed = harness_installed()
    if need_harness and not installed:
        found.append(Problem.at(KEY, "eval.benchmarks runs on EleutherAI's lm-eval harness, which is not installed",
                                f"{INSTALL}   (or remove eval.benchmarks)"))
    local: dict[str, LocalTask] = {}
    readable = True
    for i, folder in enumerate(include_folders(bench.include, recipe_dir)):
        if not _is_dir(folder):
            readable = False
            if check_paths:
                found.append(Problem.at(f"{KEY}.include[{i}]", f"task folder not found: {folder}",
                                        "include folders are relative to the recipe file"))
            continue
        tasks = local_tasks(folder)
        if not tasks and check_paths:
            found.append(Problem.at(f"{KEY}.include[{i}]", f"no lm-eval task YAML (with a `task:` key) in {folder}",
                                    "put the task's .yaml file in this folder (docs/evaluation.md)"))
        for name, task in tasks.items():
            local.setdefault(name, task)
    for i, name in enumerate(bench.tasks):
        if name in local:
            if check_paths:
                found += _missing_data(local[name], f"{KEY}.tasks[{i}]")
            continue
        if not readable or not installed or known(name):
            continue  # unknown only when every source of names could be read (without the harness: refused above)
        guess = difflib.get_close_matches(name, sorted(set(local) | installed_names()), n=1, cutoff=0.6)
        where = "the installed lm-eval harness" + (" or the include folders" if bench.include else "")
        found.append(Problem.at(f"{KEY}.tasks[{i}]", f"unknown benchmark task '{name}': not in {where}",
                                f"did you mean '{guess[0]}'?" if guess else
                                "list them with `lm_eval ls tasks`; a local task's YAML goes in an include folder"))
    return found


def _missing_data(task: LocalTask, key: str) -> list[Problem]:
    """A local task's data files the harness would not find (relative paths: to the working directory, as
    `datasets.load_dataset` reads them)."""
    return [Problem.at(key, f"task '{task.name}' ({task.yaml}) reads {f}, which does not exist",
                       "the harness reads data_files relative to the working directory; run from there or make the "
                       "path absolute")
            for f in task.data_files if "://" not in f and not any(c in f for c in "*?[") and not _exists(f)]


def _exists(file: str) -> bool:
    try:
        return Path(file).exists()
    except (OSError, ValueError):
        return False


PREFIX = "bench/"
"""metrics.jsonl keys: `bench/<task>/<metric>`."""
LOWER_IS_BETTER = ("perplexity", "bits_per_byte", "ter")
"""Harness metrics where lower is better (word_perplexity, byte_perplexity, bits_per_byte, TER); every other one
(acc, acc_norm, exact_match, f1, bleu, ...) is better higher."""


def flat(scores: dict[str, dict[str, float]]) -> dict[str, float]:
    """{task: {metric: v}} → {"bench/<task>/<metric>": v}, as metrics.jsonl holds them."""
    return {f"{PREFIX}{task}/{metric}": value for task, metrics in scores.items() for metric, value in metrics.items()}


def nested(record: dict) -> dict[str, dict[str, float]]:
    """One metrics.jsonl row's `bench/<task>/<metric>` values back as {task: {metric: v}}."""
    out: dict[str, dict[str, float]] = {}
    for key, value in record.items():
        if key.startswith(PREFIX) and isinstance(value, (int, float)):
            task, metric = key[len(PREFIX):].split("/", 1)
            out.setdefault(task, {})[metric] = value
    return out


def summary(records: list[dict]) -> dict | None:
    """summary.json's `benchmarks`: the measurements at `start` and at the end (the last one), the best value of
    each metric with its step, and `change` = end − start (metrics measured at both, stderr left out)."""
    rows = [r for r in records if "bench_at" in r]
    if not rows:
        return None
    start = next((nested(r) for r in rows if r["bench_at"] == "start"), None)
    last = rows[-1]
    end = nested(last) if last["bench_at"] != "start" else None
    best: dict[str, dict[str, dict]] = {}
    for r in rows:
        for task, metrics in nested(r).items():
            for metric, value in metrics.items():
                if metric.split(",")[0].endswith("_stderr"):
                    continue
                lower = metric.split(",")[0].endswith(LOWER_IS_BETTER)
                held = best.setdefault(task, {}).get(metric)
                if held is None or (value < held["value"] if lower else value > held["value"]):
                    best[task][metric] = {"value": value, "step": r["step"]}
    change = None
    if start is not None and end is not None:
        change = {task: {m: end[task][m] - v for m, v in metrics.items()
                         if not m.split(",")[0].endswith("_stderr") and m in end.get(task, {})}
                  for task, metrics in start.items() if task in end}
    return {"start": start, "end": end, "end_step": last["step"] if end is not None else None, "best": best,
            "change": change}
