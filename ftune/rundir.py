"""The run directory's layout: every file and folder name ftune writes under `output.dir`, in one place.

Light (no torch): the compiler, the launcher, the worker, its callbacks, save, eval and the demo all
reach the run dir through `RunDir`, so no module spells out `"final"` or `"checkpoints"` itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# ftune's markers and the one atomic writer live with the output policy (ftune.outputs); re-exported here
from ftune.outputs import CHECKPOINTS, COMPLETE_MARKER, FINAL, LOCK_FILE, PLAN, RUN_MARKER  # noqa: F401
from ftune.outputs import write_json_atomic  # noqa: F401

NODES = "nodes"
"""Per-node launch inputs of a multi-node job sharing the run dir: nodes/node<k>/ (plan.json, accelerate.yaml, the
node's lock) for node k > 0; node 0's are at the top of the run dir."""


def checkpoint_step(folder: Path) -> int:
    """N of a `checkpoint-N` folder (-1 when the name holds no step)."""
    try:
        return int(folder.name.rpartition("-")[2])
    except ValueError:
        return -1


def is_complete(folder: Path) -> bool:
    return (folder / COMPLETE_MARKER).is_file()


def mark_complete(folder: Path, info: dict) -> None:
    write_json_atomic(folder / COMPLETE_MARKER, info)


@dataclass(frozen=True)
class RunDir:
    """Paths inside one run directory."""

    root: Path

    # ownership and the one-live-run lock (ftune.launch.lock)
    @property
    def marker(self) -> Path:
        return self.root / RUN_MARKER

    @property
    def lock(self) -> Path:
        return self.root / LOCK_FILE

    def node(self, machine_rank: int) -> RunDir:
        """Where node `machine_rank` of a multi-node job keeps its launch inputs and lock: the run dir itself for
        node 0, `nodes/node<k>/` for the others (nodes share the run dir on a cluster volume; node 0 owns it)."""
        return self if machine_rank == 0 else RunDir(self.root / NODES / f"node{machine_rank}")

    def foreign_entries(self) -> list[Path]:
        """What the folder holds besides the lock and the nodes' inputs (another node may create those first)."""
        if not self.root.is_dir():
            return []
        return [p for p in self.root.iterdir() if p.name not in (LOCK_FILE, NODES)]

    # inputs, written by the launcher before the workers start
    @property
    def recipe(self) -> Path:
        return self.root / "recipe.resolved.yaml"

    @property
    def plan(self) -> Path:
        return self.root / PLAN

    @property
    def origins(self) -> Path:
        """Where each resolved recipe value came from (file:line:col, override, default): `show --origin`'s text."""
        return self.root / "recipe.origins.json"

    @property
    def estimate(self) -> Path:
        """`ftune plan`'s memory estimate of this run (written with `output.report: true`, for the report)."""
        return self.root / "estimate.json"

    @property
    def accelerate_config(self) -> Path:
        return self.root / "accelerate.yaml"

    @property
    def env(self) -> Path:
        return self.root / "env.json"

    # outputs, written by the workers
    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    @property
    def final(self) -> Path:
        return self.root / FINAL

    @property
    def merged(self) -> Path:
        """Where `ftune merge` writes the merged model by default (written as a hidden partial folder, then renamed)."""
        return self.root / "merged"

    @property
    def initial_adapter(self) -> Path:
        """The adapter as initialised (peft.init pissa/olora), which the final adapter is converted against."""
        return self.root / "initial_adapter"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def completions(self) -> Path:
        """grpo/rloo: a sample of the generated completions with their rewards, per log (JSON lines)."""
        return self.root / "completions.jsonl"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def predictions(self) -> Path:
        """Every generation eval's rows: prompt, reference, completion, scores (eval.generate, `ftune eval`)."""
        return self.root / "predictions.jsonl"

    @property
    def params(self) -> Path:
        return self.root / "params.json"

    @property
    def loss_curve(self) -> Path:
        return self.root / "loss_curve.png"

    @property
    def report(self) -> Path:
        """The run's HTML report (`ftune report`; refreshed at each log with `output.report: true`)."""
        return self.root / "report.html"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def error(self) -> Path:
        return self.root / "error.json"

    @property
    def eval_scratch(self) -> Path:
        """Output dir `ftune eval` gives its Trainer (nothing is saved there; removed after)."""
        return self.root / "eval-tmp"

    def rank_facts(self, rank: int) -> Path:
        """Distributed facts of one rank (written only when FTUNE_RECORD_FACTS=1, for tests)."""
        return self.root / f"distributed.rank{rank}.json"

    def outputs(self) -> tuple[Path, ...]:
        """What a run produces: removed when `output.overwrite` starts over."""
        return (self.final, self.checkpoints, self.initial_adapter, self.metrics, self.summary, self.params, self.loss_curve,
                self.tensorboard, self.predictions, self.report)

    def complete_checkpoints(self) -> list[Path]:
        """`checkpoint-N` folders holding the completion marker (a killed save has none), newest first."""
        if not self.checkpoints.is_dir():
            return []
        done = [p for p in self.checkpoints.glob("checkpoint-*") if is_complete(p)]
        return sorted(done, key=checkpoint_step, reverse=True)

    def latest_complete_checkpoint(self) -> Path | None:
        """The newest `checkpoint-N` folder holding the completion marker (a killed save has none)."""
        done = self.complete_checkpoints()
        return done[0] if done else None

    def is_owned(self) -> bool:
        """Whether ftune created (or adopted) this folder: only then may it write or delete inside it."""
        return self.marker.is_file()

    def has_started(self) -> bool:
        """Whether a run trained anything here (a checkpoint or a metrics line)."""
        return any(self.checkpoints.glob("checkpoint-*")) or self.metrics.exists()


def read_metrics(run: RunDir) -> list[dict]:
    """metrics.jsonl's records, with the values written as null under `nonfinite` restored (nan, inf)."""
    path = run.metrics
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for r in records:
        r.update({k: float(v) for k, v in r.pop("nonfinite", {}).items()})
    return records
