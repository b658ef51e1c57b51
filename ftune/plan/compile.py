"""Compile a validated recipe into a frozen Plan: every decision is made here, before launch.

Decides device, world size, dtype, precision, effective batch, run directory, what to resume from,
and the accelerate config + launch command. Problems that need the environment (a missing model
folder, fp16 on CPU, an unwritable output dir) are reported here, located in the recipe, all at once.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ftune import __version__
from ftune.errors import Problem, RecipeError
from ftune.plan.model import LaunchSpec, Plan
from ftune.recipe.load import looks_local

COMPLETE_MARKER = "ftune_complete.json"
"""Written into a checkpoint folder once everything in it is on disk; resume only trusts marked ones."""


def _problem(loaded, path: str, message: str, hint: str | None = None) -> Problem:
    return Problem(message=message, path=path, hint=hint, location=loaded.locate(path))


def checkpoint_step(folder: Path) -> int:
    try:
        return int(folder.name.rpartition("-")[2])
    except ValueError:
        return -1


def latest_complete_checkpoint(checkpoints_dir: Path) -> Path | None:
    """The newest `checkpoint-N` folder holding the completion marker (a killed save has none)."""
    if not checkpoints_dir.is_dir():
        return None
    done = [p for p in checkpoints_dir.glob("checkpoint-*") if (p / COMPLETE_MARKER).is_file()]
    return max(done, key=checkpoint_step, default=None)


def _resolve_resume(loaded, recipe, run_dir: Path, problems: list[Problem]) -> str | None:
    resume = recipe.checkpoint.resume
    ckpts = run_dir / "checkpoints"
    if resume is False or resume == "false":
        return None
    if resume is True or resume == "auto":
        found = latest_complete_checkpoint(ckpts)
        if found is None and resume is True:
            problems.append(
                _problem(loaded, "checkpoint.resume", f"no complete checkpoint to resume in {ckpts}",
                         "use `checkpoint.resume=auto` to start fresh when there is none")
            )
        return str(found) if found else None
    path = Path(resume).expanduser()
    if not (path / COMPLETE_MARKER).is_file() and not (path / "trainer_state.json").is_file():
        problems.append(
            _problem(loaded, "checkpoint.resume", f"{resume} is not a complete checkpoint folder",
                     "point at a checkpoints/checkpoint-N folder of an earlier run, or use `auto`")
        )
        return None
    return str(path.resolve())


def _check_run_dir(loaded, recipe, run_dir: Path, resume_from: str | None, problems: list[Problem]) -> None:
    final_done = (run_dir / "final" / COMPLETE_MARKER).is_file()
    if final_done and not recipe.output.overwrite:
        problems.append(
            _problem(loaded, "output.dir", f"{run_dir} already holds a finished run (final/ exists)",
                     "choose another output.dir (e.g. `output.dir=runs/<new-name>`) or set `output.overwrite=true`")
        )
    # The nearest existing ancestor must be writable: that is where the run dir will be created.
    probe = run_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not os.access(probe, os.W_OK | os.X_OK) or (probe.exists() and not probe.is_dir()):
        problems.append(
            _problem(loaded, "output.dir", f"cannot write the run directory {run_dir}: {probe} is not writable",
                     "set `output.dir` to a folder you can write to")
        )


def _check_inputs(loaded, recipe, problems: list[Problem]) -> None:
    model_path = recipe.model.path
    if not Path(model_path).expanduser().exists():
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        if looks_local(model_path) or offline:
            problems.append(
                _problem(loaded, "model.path", f"model folder not found: {model_path}",
                         "point model.path at a local folder holding config.json"
                         + (" (the hub is offline: HF_HUB_OFFLINE=1)" if offline else ""))
            )
    else:
        if not (Path(model_path).expanduser() / "config.json").is_file():
            problems.append(
                _problem(loaded, "model.path", f"{model_path} has no config.json",
                         "model.path must be a Hugging Face model folder (save_pretrained output)")
            )
    sources = [("data.train", recipe.data.train)]
    if isinstance(recipe.data.eval, list):
        sources.append(("data.eval", recipe.data.eval))
    for prefix, items in sources:
        for i, src in enumerate(items):
            if src.type == "hub":
                continue
            if not Path(src.path).expanduser().exists() and (looks_local(src.path) or src.type != "auto"):
                problems.append(
                    _problem(loaded, f"{prefix}.{i}.path", f"data file not found: {src.path}",
                             "paths are relative to the working directory "
                             f"({os.getcwd()}); check the spelling or run from the project root")
                )


def compile_plan(loaded, *, check_inputs: bool = True, gpus: int | None = None) -> Plan:
    """Recipe (as loaded) → frozen Plan. Raises RecipeError listing every environment problem.

    `check_inputs` checks model/data paths and the run dir; `gpus` compiles for that many GPUs per machine
    instead of the visible ones (planning a GPU job on a laptop)."""
    from ftune.launch import accelerate_config

    recipe = loaded.recipe
    problems: list[Problem] = []
    notes: list[str] = []

    num_processes, device = accelerate_config.resolve_num_processes(recipe.distributed, gpus)
    num_machines = recipe.distributed.num_machines
    world_size = num_processes * num_machines

    mp = recipe.train.mixed_precision
    if device == "cpu" and mp == "fp16":
        problems.append(
            _problem(loaded, "train.mixed_precision", "fp16 mixed precision needs a GPU; this run is on CPU",
                     "use `train.mixed_precision=bf16` (works on CPU) or `no`")
        )
    if device == "cpu" and mp == "bf16":
        notes.append("bf16 on CPU: autocast to bfloat16 (slower than fp32 on CPUs without AMX)")

    run_dir = Path(recipe.output.dir or f"runs/{recipe.name}").expanduser().resolve()
    resume_from = _resolve_resume(loaded, recipe, run_dir, problems)
    if check_inputs:
        _check_inputs(loaded, recipe, problems)
        _check_run_dir(loaded, recipe, run_dir, resume_from, problems)
    if gpus is None:  # planning for other hardware (`gpus`) skips this machine's device and package checks
        problems += _environment_problems(loaded, recipe, device, num_processes)
    if problems:
        raise RecipeError(problems, file=getattr(loaded, "file", None))

    recipe_dir = Path(loaded.file).parent
    config, cfg_notes = accelerate_config.build(recipe, device=device, num_processes=num_processes,
                                                recipe_dir=recipe_dir, check=False)  # checked above, located
    notes += cfg_notes
    command = accelerate_config.launch_command(run_dir / "accelerate.yaml", run_dir / "plan.json",
                                               python=sys.executable)
    train = recipe.train
    return Plan(
        ftune_version=__version__,
        recipe_file=str(Path(loaded.file).resolve()),
        recipe=recipe,
        secrets=dict(getattr(loaded, "secrets", {}) or {}),
        run_dir=str(run_dir),
        device=device,
        num_processes=num_processes,
        num_machines=num_machines,
        machine_rank=recipe.distributed.machine_rank,
        world_size=world_size,
        torch_dtype=recipe.model.dtype,
        mixed_precision=mp,
        effective_batch_size=train.per_device_batch_size * train.gradient_accumulation_steps * world_size,
        tokenizer_path=recipe.model.tokenizer or recipe.model.path,
        resume_from=resume_from,
        launch=LaunchSpec(accelerate_config=config, command=command, env=_worker_env(device, num_processes)),
        notes=notes,
    )


def _worker_env(device: str, num_processes: int) -> dict[str, str]:
    """CPU threads per process: physical cores / local processes (accelerate's own choice, made explicit so it is
    recorded in the plan); a user's OMP_NUM_THREADS wins."""
    if device != "cpu" or "OMP_NUM_THREADS" in os.environ:
        return {}
    try:
        import psutil

        cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except ImportError:  # pragma: no cover - psutil comes with accelerate
        cores = os.cpu_count() or 1
    return {"OMP_NUM_THREADS": str(max(1, cores // num_processes))}


def _environment_problems(loaded, recipe, device: str, num_processes: int) -> list[Problem]:
    """Checks that need this machine: devices, processes, installed packages (deepspeed, bitsandbytes)."""
    from ftune.recipe.rules.distributed import check_environment
    from ftune.worker import quantize

    found = check_environment(recipe, device, num_processes, Path(loaded.file).parent)
    problems = [_problem(loaded, path, msg, hint) for path, msg, hint in found]
    if quantize.needs_bitsandbytes(recipe):
        where = "quantization" if recipe.quantization is not None else "train.optimizer"
        problems += [_problem(loaded, where, msg, quantize.INSTALL_HINT) for msg in quantize.check_environment(recipe)]
        problems += [_problem(loaded, path, msg, hint) for path, msg, hint in quantize.check_device(recipe, device)]
    return problems
