"""Checks that need this machine, run by the compiler (`ftune plan`, `ftune run`) before anything launches:
files and folders the recipe names, devices, and installed packages. Each returns `Problem`s; the compiler
locates them all at once (`LoadedRecipe.error`). Recipe-only rules live in `ftune.recipe.rules`, checks that
need the model's structure in `ftune.plan.preflight`.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from ftune.errors import Problem
from ftune.plan import quantization
from ftune.recipe.load import looks_local
from ftune.recipe.schema import Recipe
from ftune.recipe.trainer_names import needs_package
from ftune.rundir import RunDir, is_complete

TRACKER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "comet_ml": "comet_ml",
                    "trackio": "trackio"}


def inputs(recipe: Recipe) -> list[Problem]:
    """The model folder and local data files exist."""
    found: list[Problem] = []
    model_path = recipe.model.path
    if not Path(model_path).expanduser().exists():
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        if looks_local(model_path) or offline:
            found.append(Problem.at("model.path", f"model folder not found: {model_path}",
                                    "point model.path at a local folder holding config.json"
                                    + (" (the hub is offline: HF_HUB_OFFLINE=1)" if offline else "")))
    elif not (Path(model_path).expanduser() / "config.json").is_file():
        found.append(Problem.at("model.path", f"{model_path} has no config.json",
                                "model.path must be a Hugging Face model folder (save_pretrained output)"))
    sources = [("data.train", recipe.data.train)]
    if isinstance(recipe.data.eval, list):
        sources.append(("data.eval", recipe.data.eval))
    for prefix, items in sources:
        for i, src in enumerate(items):
            if src.type == "hub":
                continue
            if not Path(src.path).expanduser().exists() and (looks_local(src.path) or src.type != "auto"):
                found.append(Problem.at(f"{prefix}.{i}.path", f"data file not found: {src.path}",
                                        "paths are relative to the working directory "
                                        f"({os.getcwd()}); check the spelling or run from the project root"))
    return found


def run_dir(recipe: Recipe, run: RunDir) -> list[Problem]:
    """The run dir can be created, and holds no finished run unless overwriting."""
    found: list[Problem] = []
    if is_complete(run.final) and not recipe.output.overwrite:
        found.append(Problem.at("output.dir", f"{run.root} already holds a finished run (final/ exists)",
                                "choose another output.dir (e.g. `output.dir=runs/<new-name>`) or set "
                                "`output.overwrite=true`"))
    # The nearest existing ancestor must be writable: that is where the run dir will be created.
    probe = run.root
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not os.access(probe, os.W_OK | os.X_OK) or (probe.exists() and not probe.is_dir()):
        found.append(Problem.at("output.dir", f"cannot write the run directory {run.root}: {probe} is not writable",
                                "set `output.dir` to a folder you can write to"))
    return found


def precision(recipe: Recipe, device: str, mixed_precision: str) -> list[Problem]:
    where = ("distributed.fsdp.mixed_precision" if recipe.distributed.fsdp is not None
             and recipe.distributed.fsdp.mixed_precision == mixed_precision else "train.mixed_precision")
    if device == "cpu" and mixed_precision == "fp16":
        return [Problem.at(where, "fp16 mixed precision needs a GPU; this run is on CPU",
                           "use `train.mixed_precision=bf16` (works on CPU) or `no`")]
    if device == "cuda" and mixed_precision == "bf16":
        import torch

        if not torch.cuda.is_bf16_supported():
            return [Problem.at(where, f"bf16 needs an Ampere or newer GPU; this one is "
                               f"{torch.cuda.get_device_name(0)}", "use `train.mixed_precision=fp16`")]
    return []


def packages(recipe: Recipe) -> list[Problem]:
    """Optional packages the recipe needs: its optimizer's, its trackers', bitsandbytes."""
    found: list[Problem] = []
    need = needs_package(recipe.train.optimizer)
    if need is not None and importlib.util.find_spec(need[0]) is None:
        found.append(Problem.at("train.optimizer", f"{recipe.train.optimizer} needs the optional package {need[1]}, "
                                "which is not installed", f"pip install '{need[1]}'   (or pick another optimizer, "
                                "e.g. adamw_torch_fused)"))
    for i, tracker in enumerate(recipe.output.report_to):
        module = TRACKER_PACKAGES.get(tracker)
        if module is not None and importlib.util.find_spec(module) is None:
            found.append(Problem.at(f"output.report_to.{i}", f"report_to '{tracker}' needs the {tracker} package, "
                                    "which is not installed", f"pip install {tracker}   (or remove it from "
                                    "output.report_to; metrics.jsonl is always written)"))
    found += quantization.check_environment(recipe)
    return found


def devices(recipe: Recipe, device: str, num_processes: int, recipe_dir: Path) -> list[Problem]:
    """GPUs, the distributed packages and the files the distributed section names."""
    d = recipe.distributed
    found: list[Problem] = []
    if d.strategy == "deepspeed":
        if importlib.util.find_spec("deepspeed") is None:
            found.append(Problem.at("distributed.strategy", "strategy 'deepspeed' needs the deepspeed package, which "
                                    "is not installed", "pip install 'ftune[deepspeed]'  (or use "
                                    "`distributed.strategy: fsdp`)"))
        elif device == "cpu":
            found.append(Problem.at("distributed.strategy", "DeepSpeed needs GPUs; this machine has none",
                                    "use `distributed.strategy: fsdp` or `ddp` on CPU"))
        if d.deepspeed is not None and d.deepspeed.config is not None:
            path = (recipe_dir / d.deepspeed.config).resolve()
            if not path.is_file():
                found.append(Problem.at("distributed.deepspeed.config", f"DeepSpeed config not found: {path}",
                                        "the path is relative to the recipe file"))
    if d.accelerate_config is not None:
        path = (recipe_dir / d.accelerate_config).resolve()
        if not path.is_file():
            found.append(Problem.at("distributed.accelerate_config", f"accelerate config not found: {path}",
                                    "the path is relative to the recipe file"))
    if device == "cuda" and d.strategy != "none":
        from ftune.plan.accelerate import visible_gpus

        gpus = visible_gpus()
        if num_processes > gpus:
            found.append(Problem.at("distributed.num_processes",
                                    f"num_processes is {num_processes} but this machine sees {gpus} GPU(s)",
                                    f"set `distributed.num_processes: {gpus}` or `auto`, or check "
                                    "CUDA_VISIBLE_DEVICES"))
    f = d.fsdp
    if device == "cpu" and d.strategy == "fsdp" and f is not None and f.cpu_ram_efficient_loading:
        found.append(Problem.at("distributed.fsdp.cpu_ram_efficient_loading",
                                "cpu_ram_efficient_loading needs GPUs (it broadcasts rank 0's weights with "
                                "sync_module_states, which fails on CPU processes)", "remove it for CPU runs"))
    if quantization.needs_bitsandbytes(recipe):
        found += quantization.check_device(recipe, device)
    return found

