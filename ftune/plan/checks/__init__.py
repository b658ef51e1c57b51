"""One table of the pre-launch checks: each defined once, with the tier it needs; each command runs every tier its
weight allows.

Tiers, cheapest first:
- `recipe`: the recipe alone. The rules (`ftune.recipe.rules`) run when a recipe loads, in every command; the rows
  here read the job's shape (machines, ranks, address, N-D sizes), which a launcher's environment may set, so the
  compiler runs them after applying it (`ftune.plan.cluster`), `launch-script` on the shape its flags give.
- `files`: the files and data the recipe names, read lightly (no torch): paths, the model folder, the accelerate
  and DeepSpeed configs, the data files' first rows, the reward models' config.json.
- `environment`: this machine: precision, packages, kernels, devices. The run dir and the checkpoint to resume
  are read by the compiler beside its decisions (`compile._resolve_resume`, `environment.run_dir`).
- `model`: the model on the meta device (`ftune.plan.checks.preflight`, run by the compiler: it also yields decisions).

`COMMANDS` says which tiers each command runs. `plan` and `data` run without the inputs on disk: a `files` row
about a missing path is listed by `plan` instead, and the model folder's checks run in `plan` (its estimate
reads the folder) but not in `data` (which reads a tokenizer folder as `model.path`). Light module: no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ftune.errors import Problem
from ftune.recipe.schema import Recipe

Tier = Literal["recipe", "files", "environment", "model"]
TIERS: tuple[Tier, ...] = ("recipe", "files", "environment", "model")

COMMANDS: dict[str, tuple[Tier, ...]] = {
    "validate": ("recipe",),
    "validate --check-paths": ("recipe", "files"),
    "launch-script": ("recipe",),  # + the job's shape from --nodes and --gpus-per-node
    "plan": TIERS,
    "data": TIERS,
    "run --dry-run": TIERS,
    "run": TIERS,
}


@dataclass(frozen=True)
class Job:
    """What the checks may read: the recipe as it runs, and what the command knows of the job and the machine."""

    recipe: Recipe
    recipe_dir: Path
    """Where relative config paths start (the recipe file's folder)."""
    world_size: int | None = None
    """Processes in the job; None when not known (`num_processes: auto` without a device count)."""
    device: str | None = None
    """This machine's device; None when the command doesn't run here (`validate`, `launch-script`)."""
    num_processes: int | None = None
    mixed_precision: str | None = None
    inputs: bool = True
    """Check the model inputs on disk (`run`, `validate --check-paths`); `plan` and `data` run without them (plan
    lists the missing ones)."""
    reads_model: bool = False
    """The command reads the model folder without the other inputs (`plan`'s estimate): its checks run."""
    model_folder: bool = True
    """`model.path` is a folder to check (not a GGUF file, whose converted folder `ftune.plan.gguf` checks)."""
    machine: bool = False
    """This machine's packages and devices are the job's (not when planning for other GPUs: `plan --gpus`)."""


@dataclass(frozen=True)
class Check:
    name: str
    tier: Tier
    run: Callable[[Job], list[Problem]]
    doc: str


def world_size(distributed, gpus: int | None = None) -> int | None:
    """The job's processes as the recipe (and a GPU count, when given) says; None when `auto` leaves it to a
    machine. `ftune.plan.accelerate.resolve_num_processes` decides the same on this machine."""
    machines = distributed.num_machines
    if distributed.strategy == "none":
        return machines
    n = distributed.num_processes
    if n == "auto":
        return gpus * machines if gpus else None
    return int(n) * machines


# ------------------------------------------------------------------------------------------ recipe
def _job_shape(job: Job) -> list[Problem]:
    from ftune.recipe.rules.distributed import JOB_RULES

    return [p for rule in JOB_RULES for p in rule(job.recipe)]


def _layout(job: Job) -> list[Problem]:
    from ftune.plan import parallelism

    return parallelism.problems(job.recipe, job.device, job.world_size)


def _batch_split(job: Job) -> list[Problem]:
    from ftune.plan import batch_size, parallelism

    if job.world_size is None or parallelism.problems(job.recipe, job.device, job.world_size):
        return []  # the world unknown, or a layout the parallelism row refuses: no ranks to divide by
    return batch_size.split_problems(job.recipe, parallelism.data_parallel(job.recipe, job.world_size))


# ------------------------------------------------------------------------------------------- files
def _paths(job: Job) -> list[Problem]:
    from ftune.plan.checks.paths import missing_inputs

    return missing_inputs(job.recipe, job.model_folder) if job.inputs else []


def _model_folder(job: Job) -> list[Problem]:
    from ftune.plan.checks import model_files

    return model_files.model_folder(job.recipe, job.model_folder) if job.inputs or job.reads_model else []


def _configs(job: Job) -> list[Problem]:
    from ftune.plan.checks.paths import missing_configs

    return missing_configs(job.recipe, job.recipe_dir)


def _data(job: Job) -> list[Problem]:
    from ftune.datafiles.check import check_fields, eval_split_rows, preference_balance

    return check_fields(job.recipe) + preference_balance(job.recipe) + eval_split_rows(job.recipe)


def _reward_models(job: Job) -> list[Problem]:
    from ftune.plan.checks import model_files

    return model_files.reward_models(job.recipe)


def _distill(job: Job) -> list[Problem]:
    from ftune.plan import distill

    return distill.problems(job.recipe) if job.inputs or job.reads_model else []


def _tool_tables(job: Job) -> list[Problem]:
    from ftune.recipe.rules.tools import table_files

    return table_files(job.recipe)


# ------------------------------------------------------------------------------------- environment
def _precision(job: Job) -> list[Problem]:
    from ftune.plan.checks import environment

    if job.device is None or job.mixed_precision is None or not (job.machine or job.device == "cpu"):
        return []
    return environment.precision(job.recipe, job.device, job.mixed_precision)


def _machine(job: Job) -> list[Problem]:
    from ftune.plan.checks import environment

    if not job.machine or job.device is None:
        return []
    return (environment.packages(job.recipe) + environment.kernels(job.recipe, job.device)
            + environment.devices(job.recipe, job.device, job.num_processes or 1))


CHECKS: tuple[Check, ...] = (
    Check("job shape", "recipe", _job_shape, "strategy vs processes and machines, machine_rank in range, machine "
          "0's address (`ftune.recipe.rules.distributed.JOB_RULES`)"),
    Check("parallelism", "recipe", _layout, "the N-D sizes against the world, strategy, tp with LoRA, "
          "quantization or checkpoints, cp's sequence length (`ftune.plan.parallelism.problems`)"),
    Check("batch split", "recipe", _batch_split, "train.global_batch_size in whole rows per data-parallel rank, "
          "and a micro-batch that divides them (`ftune.plan.batch_size.split_problems`)"),
    Check("paths", "files", _paths, "the local model, tokenizer and data paths exist (`ftune.plan.checks.paths`)"),
    Check("model folder", "files", _model_folder, "the model folder holds config.json, whole safetensors, and a "
          "VLM's image processor and chat template (`ftune.plan.checks.model_files.model_folder`)"),
    Check("configs", "files", _configs, "the accelerate and DeepSpeed configs the recipe names exist"),
    Check("data", "files", _data, "the data files' fields, formats, roles and preference pairs in their first "
          "rows, an eval split that would hold out no row (`ftune.datafiles.check`)"),
    Check("reward models", "files", _reward_models, "each `reward_model` reward is a one-logit sequence "
          "classifier, read from its config.json"),
    Check("distillation", "files", _distill, "the distill teacher is a model folder whose tokenizer (vocabulary, "
          "special tokens) is the student's; model.init_from's layers exist (`ftune.plan.distill.problems`)"),
    Check("tool tables", "files", _tool_tables, "each `lookup` tool's table file exists and reads as a table "
          "(`ftune.recipe.rules.tools.table_files`)"),
    Check("precision", "environment", _precision, "the mixed precision this device can run"),
    Check("machine", "environment", _machine, "the packages, kernels and devices the recipe needs on this machine"),
)


def problems(job: Job, tiers: tuple[Tier, ...], skip: tuple[str, ...] = ()) -> list[Problem]:
    """Every problem the checks of `tiers` find (the `model` tier is the compiler's preflight, not a row here)."""
    return [p for check in CHECKS if check.tier in tiers and check.name not in skip for p in check.run(job)]
