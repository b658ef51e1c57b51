"""Compile a validated recipe into a frozen Plan: every decision is made here, before launch.

Decides device, world size, the one mixed precision, effective batch, run directory, what to resume from,
the accelerate config + launch command, the model-loading kwargs and the TrainingArguments kwargs. Checks
that need this machine (`ftune.plan.checks.environment`) are reported here, located in the recipe, all at once.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ftune import __version__, adapter, benchmarks, hub
from ftune.datafiles import prompts
from ftune.errors import Problem
from ftune.models.meta import MetaModel
from ftune.plan import (accelerate, batch_size, batching, checks, cluster, ddp, distill, gguf, parallelism,
                        preference, quantization, rl, tiling)
from ftune.plan.checks import environment, model_files, preflight, resume
from ftune.plan.adapter import continue_adapter
from ftune.plan.evaluation import generation_metrics
from ftune.plan.loading import model_load
from ftune.plan.plan import LaunchSpec, Plan
from ftune.plan.threads import CpuThreads, cap_num_proc, cpu_threads, usable_cores
from ftune.plan.trackers import tracker_env
from ftune.plan.trainer import checkpointing_owner, training_arguments
from ftune.recipe.objectives import objective
from ftune.recipe.schema import Recipe
from ftune.recipe.trainer_names import BNB_OPTIMIZERS
from ftune.rundir import RunDir, is_complete


TOKENIZER_FILES = hub.TOKENIZER_FILES


def tokenizer_source(recipe: Recipe) -> str:
    """Where the tokenizer comes from: `model.tokenizer`, else the model folder (the worker and `ftune data`); an
    adapter folder being continued without a tokenizer of its own (a run's final/ has one) gives its base's."""
    if recipe.model.tokenizer:
        return recipe.model.tokenizer
    m = recipe.model
    folder = hub.folder(m.path, m.revision, adapter.ADAPTER_CONFIG) or Path(m.path).expanduser()  # a cached id too
    if adapter.is_adapter(folder) and not any((folder / f).is_file() for f in TOKENIZER_FILES):
        base = continue_adapter(recipe)[0].model.path
        return base or recipe.model.path
    return recipe.model.path


def mixed_precision(recipe: Recipe) -> str:
    """The one autocast precision: `distributed.fsdp.mixed_precision` when set, else `train.mixed_precision`."""
    f = recipe.distributed.fsdp
    if recipe.distributed.strategy == "fsdp" and f is not None and f.mixed_precision != "auto":
        return f.mixed_precision
    return recipe.train.mixed_precision


def _resolve_resume(recipe: Recipe, run: RunDir, problems: list[Problem], notes: list[str]) -> str | None:
    resume = recipe.checkpoint.resume
    if resume is False or resume == "false":
        return None
    if recipe.output.overwrite:  # a fresh run: never resume this dir's checkpoints (they are removed)
        if resume is True or (resume != "auto" and Path(resume).expanduser().resolve().is_relative_to(run.root)):
            problems.append(Problem.at("checkpoint.resume", "output.overwrite starts a fresh run, so it can't resume "
                                       f"from {run.root}", "drop output.overwrite to resume, or set "
                                       "`checkpoint.resume=auto`"))
            return None
        if resume == "auto":
            return None
    if resume is True or resume == "auto":
        found = None
        for candidate in run.complete_checkpoints():  # newest first; one cut short (a full disk) is skipped
            problem = model_files.checkpoint_problem(candidate)
            if problem is None:
                found = candidate
                break
            notes.append(f"{candidate.name} can't be resumed ({problem}); falling back to an earlier checkpoint")
        if found is None and resume is True:
            problems.append(Problem.at("checkpoint.resume", f"no complete checkpoint to resume in {run.checkpoints}",
                                       "use `checkpoint.resume=auto` to start fresh when there is none"))
        return str(found) if found else None
    path = Path(resume).expanduser()
    if not is_complete(path) and not (path / "trainer_state.json").is_file():
        problems.append(Problem.at("checkpoint.resume", f"{resume} is not a complete checkpoint folder",
                                   "point at a checkpoints/checkpoint-N folder of an earlier run, or use `auto`"))
        return None
    return str(path.resolve())


def _from_launcher(recipe: Recipe, environ, problems: list[Problem], notes: list[str]):
    """The recipe with `distributed.*` as the launcher's environment says (torchrun, PET_*, OMPI_*, SLURM_*)."""
    found, bad = cluster.detect(os.environ if environ is None else environ)
    problems += bad
    if found is None:
        return recipe, None
    distributed, bad, said = cluster.apply(recipe.distributed, found)
    problems += bad
    notes += said
    return recipe.model_copy(update={"distributed": distributed}), found


@dataclass
class Compiled:
    """A compile's Plan, and the model it built on the meta device for its checks (None where it built none)."""

    plan: Plan
    meta: MetaModel | None
    """Handed to the estimate (`ftune plan`, a run's report), which then builds nothing; it is the estimate's to
    change (the method is injected into it), so it is handed on once."""


def compile_plan(loaded, *, check_inputs: bool = True, gpus: int | None = None, environ=None,
                 reads_model: bool = False, choose: batch_size.Chooser | None = None) -> Plan:
    """Recipe (as loaded) → frozen Plan (`compile_with_model`, its meta model dropped)."""
    return compile_with_model(loaded, check_inputs=check_inputs, gpus=gpus, environ=environ,
                              reads_model=reads_model, choose=choose).plan


def compile_with_model(loaded, *, check_inputs: bool = True, gpus: int | None = None, environ=None,
                       reads_model: bool = False, choose: batch_size.Chooser | None = None) -> Compiled:
    """Recipe (as loaded) → frozen Plan, with the meta model its checks built. Raises RecipeError listing every
    environment problem.

    Every pre-launch check runs here, so `plan`, `run --dry-run` and `run` refuse the same recipes: every tier of
    the table of checks (`ftune.plan.checks`: the job's shape once the launcher's environment is applied, the
    files and data, this machine) and the model's structure on the meta device (`ftune.plan.checks.preflight`; without
    `check_inputs` on the config the one resolver finds: the cache's, `model.config`, the catalog's).
    `check_inputs` checks model/data paths and the run dir; `gpus` compiles for that many GPUs per machine instead
    of the visible ones (planning a GPU job on a laptop: this machine's devices and packages are not checked then); `environ` is read for a launcher's
    variables (`ftune.plan.cluster`; default os.environ); `reads_model`: the model folder's checks run without
    `check_inputs` (`plan`, whose estimate reads it); `choose` sizes `auto` micro-batches and checkpointing from the
    memory estimate (`ftune.estimate.autobatch`, handed in by the commands that plan memory: `plan`, `run`)."""
    written, gguf_source, problems = gguf.resolve(loaded.recipe)  # model.path at a .gguf: its converted folder
    recipe_dir = Path(loaded.file).parent
    recipe, adapter_dir, adapter_problems = continue_adapter(written)  # model.path at an adapter: its base, its peft
    problems += adapter_problems
    notes: list[str] = []
    before = len(problems)
    recipe, job = _from_launcher(recipe, environ, problems, notes)  # before any check reads the job's shape
    launcher_agrees = len(problems) == before
    if gpus is None:  # preprocessing runs here: no more processes than this machine's cores
        recipe, capped = cap_num_proc(recipe, usable_cores())
        problems += capped

    if recipe.distributed.strategy == "ddp" and getattr(loaded.origins.get("distributed.strategy"), "origin",
                                                          None) == "default":  # the schema's reading of the job
        notes.append("distributed.strategy is not set: several processes or machines run DDP (set it to fsdp or "
                     "deepspeed to shard)")
    num_processes, device = accelerate.resolve_num_processes(recipe.distributed, gpus)
    world_size = num_processes * recipe.distributed.num_machines
    mp = mixed_precision(recipe)
    if device == "cpu" and mp == "bf16":
        notes.append("bf16 on CPU: autocast to bfloat16 (slower than fp32 on CPUs without AMX)")

    run = RunDir(Path(recipe.output.dir or f"runs/{recipe.name}").expanduser().resolve())
    resume_from = _resolve_resume(recipe, run, problems, notes)
    if check_inputs:
        problems += environment.run_dir(recipe, run)
        if resume_from is not None:
            problems += resume.resume_compatible(recipe, Path(resume_from))
    shape = checks.Job(recipe, recipe_dir, world_size=world_size, device=device, num_processes=num_processes,
                       mixed_precision=mp, inputs=check_inputs, reads_model=reads_model,
                       model_folder=gguf_source is None, machine=gpus is None)
    # the recipe, files and environment tiers (the model tier is the preflight below); the job-shape rules only
    # on a shape the launcher's environment agrees with (its own problems say what contradicts)
    problems += checks.problems(shape, ("recipe", "files", "environment"),
                                skip=() if launcher_agrees else ("job shape",))
    problems += benchmarks.problems(recipe.eval.benchmarks, recipe_dir, check_paths=check_inputs,
                                    need_harness=gpus is None)
    model_known = not any(p.path == "model.path" or p.path.startswith("peft.") for p in problems)
    # a GGUF's converted folder is written by `ftune run` after compiling: its checks run there, once it exists
    converted = gguf_source is None or preflight.config_is_local(recipe)
    inspected = preflight.Inspection()
    if model_known and converted:  # not on top of a refusal
        continued = (written, adapter_dir) if adapter_dir is not None else None
        # the model on the meta device, from the one resolver's config (the folder, the cache, the hub, model.config,
        # the catalog): `plan` without the inputs decides the wrap classes and DDP's unused parameters as `run` does
        inspected = preflight.inspect(recipe, device, continued, required=check_inputs)
        problems += inspected.problems
    batch_note = None
    if not any(p.severity == "error" for p in problems):  # sized on a model the checks accept
        recipe, batch_problems, batch_note = batch_size.resolve(
            recipe, parallelism.data_parallel(recipe, world_size),
            choose and (lambda r, **kw: choose(r, world_size=world_size, num_processes=num_processes, device=device,
                                               **kw)))
        problems += batch_problems
    if errors := [p for p in problems if p.severity == "error"]:
        raise loaded.error(errors)
    if batch_note is not None:
        notes.append(batch_note)
    warnings = [p.render() for p in loaded.error(problems).problems]  # what is left: warnings, training goes on

    config, cfg_notes = accelerate.build(recipe, device=device, num_processes=num_processes,
                                         recipe_dir=recipe_dir, mixed_precision=mp, wrap_classes=inspected.wrap)
    notes += cfg_notes
    train = recipe.train
    obj = objective(train.objective)
    if adapter_dir is not None:
        notes.append(f"continuing the {recipe.peft.method} adapter {adapter_dir} (loaded trainable) over its base "
                     f"{recipe.model.path}")
    if (ref := preference.reference_note(recipe, continued=adapter_dir is not None)) is not None:
        notes.append(ref)
    notes += rl.notes(recipe, world_size, continued=adapter_dir is not None) + distill.notes(recipe)
    if (fsdp_mp := preference.fsdp_mixed_precision(recipe, mp)) is not None:
        notes.append(f"fsdp {mp}: {train.objective} log-probs stay float32 (FSDP2 outputs not cast to {mp}, "
                     "which would round each sequence's summed log-prob)")
    trainer = (training_arguments(recipe, run=run, device=device, world_size=world_size, mixed_precision=mp,
                                  accelerate_config=config, resuming=resume_from is not None)
               | preference.config_kwargs(recipe) | rl.config_kwargs(recipe) | distill.config_kwargs(recipe)
               | ddp.find_unused(recipe, world_size, inspected.experts, notes))
    load = model_load(recipe, adapter=adapter_dir)
    layout = parallelism.decide(recipe)
    notes += parallelism.notes(layout, world_size)
    effective_batch = (train.per_device_batch_size * train.gradient_accumulation_steps
                       * parallelism.data_parallel(recipe, world_size))
    if gguf_source is not None:
        load = load.model_copy(update={"gguf": gguf_source})
        notes.append(gguf.note(gguf_source, recipe.model.path))
    # this machine's cores, on CPU and CUDA alike (a GPU step's host work, cuDNN's plan for each new shape
    # included, ran single-threaded under accelerate's default of 1); a plan for other machines (`gpus`) leaves it
    # to the run there
    threads = cpu_threads(train.threads, num_processes) if gpus is None else None
    if inspected.meta is not None:
        for line in (tiling.note(recipe, inspected.meta.config, recipe.data.max_seq_length),
                     tiling.loss_note(recipe, inspected.meta.config, recipe.data.max_seq_length)):
            if line is not None:
                notes.append(line)
    prompt = prompts.decide(recipe)
    if (line := prompts.note(recipe, prompt)) is not None:
        notes.append(line)
    plan = Plan(
        ftune_version=__version__,
        recipe_file=str(Path(loaded.file).resolve()),
        recipe=recipe,
        secrets=dict(getattr(loaded, "secrets", {}) or {}),
        run_dir=str(run.root),
        device=device,
        num_processes=num_processes,
        world_size=world_size,
        mixed_precision=mp,
        effective_batch_size=effective_batch,
        parallelism=layout,
        tokenizer_path=tokenizer_source(written),
        model_load=load,
        data=batching.data_plan(recipe, step_samples=effective_batch),
        activation_checkpointing=checkpointing_owner(trainer),
        tiled_mlp_shards=tiling.shards(recipe),
        tiled_loss_shards=tiling.loss_shards(recipe),
        upcast_non_quantized=recipe.kbit is not None and quantization.upcasts(recipe),
        trainer=trainer,
        uses_bitsandbytes="quantization_config" in load.kwargs or trainer.get("optim") in BNB_OPTIMIZERS,
        config_class=obj.config_path,
        trainer_class=obj.trainer_path,
        family=obj.family,
        teacher=distill.teacher_load(recipe),
        fsdp_mixed_precision=fsdp_mp,
        resume_from=resume_from,
        prompt=prompt,
        generate_metrics=generation_metrics(recipe) if recipe.eval.generate is not None else None,
        benchmarks=benchmarks.plan(recipe.eval.benchmarks, recipe_dir,
                                   recipe.eval.batch_size or train.per_device_batch_size),
        cpu_threads=threads,
        cluster=job,
        launch=LaunchSpec(
            accelerate_config=config,
            command=accelerate.launch_command(run.node(recipe.distributed.machine_rank).accelerate_config,
                                              run.node(recipe.distributed.machine_rank).plan, python=sys.executable),
            env=_worker_env(threads, run) | tracker_env(recipe),
        ),
        notes=notes,
        warnings=warnings,
    )
    return Compiled(plan, inspected.meta)


def _worker_env(threads: CpuThreads | None, run: RunDir) -> dict[str, str]:
    """Environment the workers get: the TensorBoard folder, the threads per process and OpenMP's wait policy
    (`ftune.plan.threads`; accelerate keeps an OMP_NUM_THREADS that is set)."""
    env = {"TENSORBOARD_LOGGING_DIR": str(run.tensorboard)}
    return env | (threads.env() if threads is not None else {})
