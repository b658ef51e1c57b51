"""What a report shows, read from run dirs: the header facts, the status, the chart series, the tables.

Every value comes from a file of the run dir, read through `RunDir`; nothing is recomputed from a model.
The result is plain data (`RunFacts`, `Chart`), so the page and the tests read the same values.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import yaml

from ftune.errors import EXIT_TERMINATED, UsageError
from ftune.outputs import lock_holder
from ftune.rundir import RunDir, checkpoint_step, is_complete, read_metrics

MAX_PREDICTIONS = 2000
"""predictions.jsonl rows kept in the page (worst first); the count of all rows is shown."""
MAX_COMPLETIONS = 200
"""completions.jsonl rows kept, from a few steps spread over the run."""
COMPLETION_STEPS = 5
NOT_SERIES = {"step", "epoch", "time", "nonfinite", "total_flos", "train_runtime", "train_samples_per_second",
              "train_steps_per_second", "train_loss", "eval_runtime", "eval_samples_per_second",
              "eval_steps_per_second", "eval_generated"}
"""metrics.jsonl keys that are no curve: the record's position, the Trainer's end-of-training totals, and an
eval's own timing and row count."""


@dataclass(frozen=True)
class Group:
    """One chart: the metrics.jsonl keys it draws (exact, or a prefix ending in '/'), in order."""

    id: str
    title: str
    keys: tuple[str, ...]
    unit: str = ""


GROUPS = (
    Group("loss", "loss (train, eval)", ("loss", "eval_loss")),
    Group("lr", "learning rate", ("learning_rate",)),
    Group("grad_norm", "gradient norm", ("grad_norm",)),
    Group("tokens", "throughput", ("tokens_per_second",), "tokens/s"),
    Group("reward", "reward (mean, std, per reward)", ("reward", "reward_std", "rewards/")),
    Group("kl", "KL to the reference", ("kl",)),
    Group("length", "completion length", ("completions/mean_length", "completions/min_length",
                                          "completions/max_length"), "tokens"),
    Group("zero_adv", "zero-advantage fraction (groups whose rewards are all equal)", ("frac_reward_zero_std",)),
    Group("perplexity", "eval perplexity", ("eval_perplexity",)),
    Group("eval", "eval metrics and benchmarks", ("eval_",)),
)
"""The charts in order; a key no group takes gets a chart of its own under "more metrics"."""


@dataclass
class Status:
    kind: str
    """finished | stopped | failed | running | incomplete"""
    text: str
    step: int | None = None


@dataclass
class RunFacts:
    root: Path
    label: str
    recipe: dict
    origins: dict[str, str]
    plan: dict
    env: dict
    params: dict
    estimate: dict
    summary: dict
    records: list[dict]
    status: Status
    series: dict[str, list[list[float]]]
    predictions: list[dict] = field(default_factory=list)
    predictions_total: int = 0
    completions: list[dict] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.recipe.get("name") or self.root.name)

    def final_metrics(self) -> tuple[dict, str]:
        """summary.json's numbers, or, for a run without one (stopped, failed, running), each metric's last logged
        value; with the source named."""
        if self.summary:
            return self.summary, "summary.json"
        return {k: points[-1][1] for k, points in self.series.items()}, "the last logged values: no summary.json yet"

    def header(self) -> list[tuple[str, str]]:
        """(label, text) rows of the run's header."""
        r, plan = self.recipe, self.plan
        model = r.get("model") or {}
        peft = r.get("peft") or {}
        quant = r.get("quantization") or {}
        train = r.get("train") or {}
        data = r.get("data") or {}
        method = str(peft.get("method", "?")) + (f" · {quant.get('bits')}-bit" if quant else "")
        if peft.get("method") == "lora":  # a finished run's recipe as a dict, read without the schema: no hooks
            method += f" (r {peft.get('r')}, alpha {peft.get('alpha')})"
        sources = [f"{s.get('path') or s.get('hub') or '?'} ({s.get('format', 'auto')})" for s in data.get("train") or []]
        rows = [("recipe", self.name), ("model", str(model.get("path", "?"))), ("method", method),
                ("objective", str(train.get("objective", "sft"))), ("data", ", ".join(sources) or "?")]
        if self.params.get("trainable"):
            rows.append(("parameters", f"{self.params['trainable']:,} trainable / {self.params['total']:,} total"))
        if plan:
            rows.append(("devices", f"{plan.get('world_size', '?')} × {plan.get('device', '?')}, precision "
                         f"{plan.get('mixed_precision', '?')}, effective batch {plan.get('effective_batch_size', '?')}"))
        started, ended = self.dates()
        rows.append(("started", started or "?"))
        if ended:
            rows.append(("last written", ended))
        rows.append(("status", self.status.text))
        rows.append(("run dir", str(self.root)))
        return rows

    def dates(self) -> tuple[str | None, str | None]:
        """When the run was launched (env.json) and its last metrics line (UTC)."""
        started = self.env.get("created")
        times = [r["time"] for r in self.records if isinstance(r.get("time"), (int, float))]
        ended = datetime.fromtimestamp(max(times), timezone.utc).isoformat(timespec="seconds") if times else None
        return started, ended

    def decisions(self) -> list[tuple[str, str]]:
        """plan.json's decisions, one row each (the nested dicts as compact JSON)."""
        keys = ("device", "num_processes", "world_size", "mixed_precision", "effective_batch_size", "parallelism",
                "activation_checkpointing", "upcast_non_quantized", "trainer_class", "config_class", "resume_from",
                "generate_metrics", "prompt", "cpu_threads", "data", "model_load", "trainer", "notes", "warnings")
        rows = []
        for k in keys:
            if k in self.plan and self.plan[k] not in (None, [], {}):
                v = self.plan[k]
                rows.append((k, v if isinstance(v, str) else json.dumps(v, sort_keys=True)))
        launch = self.plan.get("launch") or {}
        if launch.get("command"):
            rows.append(("launch", " ".join(launch["command"])))
        return rows


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:  # a line being written by a live run
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def status(run: RunDir, records: list[dict], summary: dict) -> Status:
    """finished (final/ complete), stopped at step N (SIGTERM, or killed: no final/), failed (error.json), or
    running (the run dir's lock is held)."""
    steps = [r["step"] for r in records if isinstance(r.get("step"), int)]
    last = max(steps) if steps else None
    done = run.complete_checkpoints()
    step = max(last or 0, checkpoint_step(done[0]) if done else 0) or None
    if is_complete(run.final) and summary:
        return Status("finished", f"finished at step {step}" if step else "finished", step)
    error = _read_json(run.error)
    if error:
        if error.get("exit_code") == EXIT_TERMINATED:
            text = f"stopped at step {step}" if step else "stopped before training started"
            return Status("stopped", text + (f" (checkpoint-{checkpoint_step(done[0])} saved)" if done else ""), step)
        hint = f" (hint: {error['hint']})" if error.get("hint") else ""
        return Status("failed", f"failed{f' at step {step}' if step else ''}: {error.get('message', '?')}{hint}", step)
    if run.lock.exists() and lock_holder(run.root) is not None:
        total = ((_read_json(run.plan).get("trainer") or {}).get("max_steps") or 0)
        return Status("running", f"running: step {step or 0}" + (f" of {total}" if total > 0 else ""), step)
    return Status("stopped", f"stopped at step {step} (no final model, no error recorded)" if step
                  else "not started (no metrics)", step)


def series(records: list[dict], tokens_per_step: float | None) -> dict[str, list[list[float]]]:
    """metrics.jsonl as curves: key → [[step, value], ...] (finite values), and tokens/s between two train logs
    (params.json's tokens per step × steps / seconds)."""
    out: dict[str, list[list[float]]] = {}
    for r in records:
        step = r.get("step")
        if not isinstance(step, (int, float)):
            continue
        for k, v in r.items():
            if k in NOT_SERIES or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                continue
            out.setdefault(k, []).append([step, v])
    if tokens_per_step:
        logs = [(r["step"], r["time"]) for r in records if "loss" in r and isinstance(r.get("time"), (int, float))]
        rates = [[s1, round((s1 - s0) * tokens_per_step / (t1 - t0), 1)]
                 for (s0, t0), (s1, t1) in zip(logs, logs[1:]) if s1 > s0 and t1 > t0]
        if rates:
            out["tokens_per_second"] = rates
    return out


def _predictions(run: RunDir) -> tuple[list[dict], int]:
    """predictions.jsonl worst first (the lowest mean score), at most MAX_PREDICTIONS rows."""
    rows = _read_jsonl(run.predictions)

    def score(row: dict) -> float:
        scores = [v for v in (row.get("scores") or {}).values() if isinstance(v, (int, float))]
        return sum(scores) / len(scores) if scores else 0.0

    ranked = sorted(rows, key=score)
    return ranked[:MAX_PREDICTIONS], len(rows)


def _completions(run: RunDir) -> list[dict]:
    """completions.jsonl at up to COMPLETION_STEPS steps spread over the run (first and last included)."""
    rows = _read_jsonl(run.completions)
    steps = sorted({r.get("step") for r in rows if isinstance(r.get("step"), int)})
    if len(steps) > COMPLETION_STEPS:
        picks = {steps[round(i * (len(steps) - 1) / (COMPLETION_STEPS - 1))] for i in range(COMPLETION_STEPS)}
    else:
        picks = set(steps)
    return [r for r in rows if r.get("step") in picks][:MAX_COMPLETIONS]


def read_run(root: Path | str) -> RunFacts:
    """One run dir's facts; a folder that is no run dir is a located error."""
    path = Path(root).expanduser()
    run = RunDir(path)
    if not path.is_dir():
        raise UsageError(f"{root}: no such run dir", hint="name the run's output.dir, e.g. runs/<recipe name>")
    if not (run.plan.is_file() or run.marker.is_file()):
        raise UsageError(f"{root} is not a run dir: it holds no plan.json",
                         hint="name a folder `ftune run` wrote (its output.dir)")
    try:
        recipe = yaml.safe_load(run.recipe.read_text()) if run.recipe.is_file() else {}
    except (OSError, yaml.YAMLError):
        recipe = {}
    records = read_metrics(run) if run.metrics.is_file() else []
    summary = _read_json(run.summary)
    params = _read_json(run.params)
    predictions, total = _predictions(run)
    return RunFacts(root=path, label=path.name, recipe=recipe if isinstance(recipe, dict) else {},
                    origins=_read_json(run.origins), plan=_read_json(run.plan), env=_read_json(run.env),
                    params=params, estimate=_read_json(run.estimate), summary=summary, records=records, status=status(run, records, summary),
                    series=series(records, params.get("tokens_per_step")), predictions=predictions,
                    predictions_total=total, completions=_completions(run))


@dataclass
class Chart:
    id: str
    title: str
    unit: str
    lines: list[dict]
    """{"run": label, "key": metrics key, "points": [[step, value], ...]}"""

    @property
    def points(self) -> int:
        return sum(len(line["points"]) for line in self.lines)


def _member(group: Group, key: str) -> bool:
    return any(key == k or (k.endswith(("/", "_")) and key.startswith(k)) for k in group.keys)


def charts(runs: list[RunFacts]) -> list[Chart]:
    """The charts of one run, or of several overlaid (one line per run and key)."""
    keys: list[str] = []
    for run in runs:
        keys += [k for k in run.series if k not in keys]
    out: list[Chart] = []
    taken: set[str] = set()
    for group in GROUPS:
        members = [k for k in keys if _member(group, k) and k not in taken]
        ordered = [k for k in group.keys if k in members] + [k for k in members if k not in group.keys]
        lines = [{"run": run.label, "key": k, "points": run.series[k]} for k in ordered for run in runs
                 if k in run.series]
        taken |= set(members)
        if lines:
            out.append(Chart(group.id, group.title, group.unit, lines))
    for k in keys:
        if k not in taken:
            out.append(Chart(f"more-{k}", k, "", [{"run": run.label, "key": k, "points": run.series[k]}
                                                    for run in runs if k in run.series]))
    return out


def recipe_diff(runs: list[RunFacts]) -> list[tuple[str, list[str]]]:
    """The resolved recipe keys whose values differ between the runs: (dotted key, each run's value as text)."""
    flat = [_flatten(run.recipe) for run in runs]
    keys: list[str] = []
    for f in flat:
        keys += [k for k in f if k not in keys]
    missing = object()
    rows = []
    for k in keys:
        values = [f.get(k, missing) for f in flat]
        if any(v != values[0] for v in values[1:]):
            rows.append((k, ["(not set)" if v is missing else json.dumps(v) for v in values]))
    return rows


def _flatten(value, prefix: str = "") -> dict:
    if isinstance(value, dict) and value:
        out = {}
        for k, v in value.items():
            out |= _flatten(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        out = {}
        for i, v in enumerate(value):
            out |= _flatten(v, f"{prefix}[{i}]")
        return out
    return {prefix: value}


def labels(roots: list[Path]) -> list[str]:
    """Names that tell the runs apart: the folder's name, with its parent's where two share it."""
    names = [p.name for p in roots]
    return [f"{p.parent.name}/{p.name}" if names.count(p.name) > 1 else p.name for p in roots]
