"""Checks that need this machine: devices, installed packages, kernels, the run dir (the model folder's and
reward models' files: `ftune.plan.checks.model_files`). Each returns `Problem`s; the table of checks (`ftune.plan.checks`) says which
commands run each, and the compiler locates them all at once (`LoadedRecipe.error`). Recipe-only rules live in `ftune.recipe.rules`, checks that
need the model's structure in `ftune.plan.checks.preflight`.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from ftune.errors import Problem
from ftune.plan import qat, quantization
from ftune.recipe.objectives import TRL_INSTALL, TRL_PACKAGE, family_of, objective
from ftune.recipe.schema import Recipe
from ftune.recipe.trackers import TRACKERS
from ftune.recipe.trainer_names import needs_package
from ftune.rundir import RunDir, is_complete



def run_dir(recipe: Recipe, run: RunDir) -> list[Problem]:
    """The run dir is a folder of its own that ftune owns (or can create), and holds no finished run unless
    overwriting."""
    found: list[Problem] = []
    root = run.root
    special = {Path(root.anchor): "a filesystem root", Path.home().resolve(): "your home directory",
               Path.cwd().resolve(): "the working directory itself"}
    if root in special:
        return [Problem.at("output.dir", f"{root} is {special[root]}; a run dir must be a folder of its own",
                           f"use a subfolder, e.g. `output.dir=runs/{recipe.name}`")]
    if root.is_dir() and not run.is_owned() and run.foreign_entries():
        found.append(Problem.at("output.dir", f"{root} exists and was not created by ftune (it has no "
                                f"{run.marker.name}); ftune writes and deletes only in folders it created",
                                "choose a new output.dir, or an empty folder"))
        return found
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
    return fp8(recipe, device)


FP8_CAPABILITY = (8, 9)
"""FP8 tensor cores: Ada (8.9), Hopper (9.0), Blackwell (10.0, 12.0)."""


def fp8(recipe: Recipe, device: str) -> list[Problem]:
    """`train.precision: fp8` on a device without FP8 tensor cores, or without torchao."""
    if recipe.train.precision != "fp8":
        return []
    need = f"a GPU of compute capability >= {FP8_CAPABILITY[0]}.{FP8_CAPABILITY[1]} (Ada, Hopper, Blackwell)"
    hint = "remove `train.precision` (bf16 mixed precision trains on any GPU)"
    if device != "cuda":
        return [Problem.at("train.precision", f"fp8 training needs {need}; this run is on {device}", hint)]
    import torch

    name, cap = torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0)
    if cap < FP8_CAPABILITY:
        return [Problem.at("train.precision", f"fp8 training needs {need}; this one is {name} "
                           f"(compute capability {cap[0]}.{cap[1]})", hint)]
    if not _importable("torchao.float8"):
        return [Problem.at("train.precision", "fp8 training needs torchao, which is not installed",
                           "pip install 'ftune[fp8]'   (torchao)")]
    return []


def _importable(module: str) -> bool:
    """find_spec of a dotted name imports its parents: a missing parent is a missing module, not an error."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def packages(recipe: Recipe) -> list[Problem]:
    """Optional packages the recipe needs: its optimizer's, its trackers', bitsandbytes, trl for its objective."""
    found: list[Problem] = []
    need = needs_package(recipe.train.optimizer)
    if need is not None and importlib.util.find_spec(need[0]) is None:
        found.append(Problem.at("train.optimizer", f"{recipe.train.optimizer} needs the optional package {need[1]}, "
                                "which is not installed", f"pip install '{need[1]}'   (or pick another optimizer, "
                                "e.g. adamw_torch_fused)"))
    for i, name in enumerate(recipe.output.report_to):
        tracker = TRACKERS.get(name)
        missing = [m for m in tracker.modules if not _importable(m)] if tracker else []
        if missing:
            found.append(Problem.at(f"output.report_to.{i}", f"report_to '{name}' needs {', '.join(missing)}, "
                                    "which is not installed", f"{tracker.install}   (or remove it from "
                                    "output.report_to; metrics.jsonl is always written)"))
    found += quantization.check_environment(recipe) + torchvision(recipe) + vision_objective(recipe)
    obj = objective(recipe.train.objective)
    if obj.needs_trl and importlib.util.find_spec(TRL_PACKAGE) is None:
        found.append(Problem.at("train.objective", f"objective '{obj.name}' runs on TRL's {obj.trainer_class}, and "
                                "trl is not installed", f"{TRL_INSTALL}   (or `train.objective: sft`)"))
    return found


TORCHVISION_INSTALL = ("pip install torchvision, the build of your torch (torch 2.13: torchvision 0.28; a CPU torch "
                       "needs the CPU build, `--index-url https://download.pytorch.org/whl/cpu`)")


def torchvision(recipe: Recipe) -> list[Problem]:
    """A VLM family whose processor transformers builds only with torchvision (`NEEDS_TORCHVISION`: Qwen-VL's
    takes a video processor even for images), read from the local config.json, on a machine without it."""
    from ftune.models.vision_parts import NEEDS_TORCHVISION, local_model_type

    if recipe.model.task != "image-text-to-text" or importlib.util.find_spec("torchvision") is not None:
        return []
    model_type = local_model_type(recipe.model.path)
    if model_type not in NEEDS_TORCHVISION:
        return []
    return [Problem.at("model.path", f"{model_type}'s processor needs torchvision in transformers 5.23 (it builds "
                       "a video processor even for images), and torchvision is not installed", TORCHVISION_INSTALL)]


def vision_objective(recipe: Recipe) -> list[Problem]:
    """A preference or RL objective on image rows of a VLM family TRL's trainers can't take
    (`ftune.models.vision_parts.TRL_IMAGES_REFUSED`), read from the local config.json."""
    from ftune.models.vision_parts import local_model_type, trl_images_problem

    if recipe.model.task != "image-text-to-text" or family_of(recipe).next_token_loss:
        return []
    model_type = local_model_type(recipe.model.path)
    why = trl_images_problem(model_type)
    if why is None:
        return []
    return [Problem.at("model.path", f"train.objective '{recipe.train.objective}' on {model_type} image rows is not "
                       f"supported: {why}", "train this family with `train.objective: sft` (vision-chat rows), or "
                       "use a family TRL takes images for (LLaVA, LLaVA-NeXT, Qwen2/2.5/3-VL, Gemma 3, Idefics3, "
                       "SmolVLM; docs/vision.md)")]


FLEX_CPU = ("torch has no FlexAttention backward on CPU, and its compiled CPU forward (torch 2.13) gives wrong "
            "outputs, or NaN, for grouped-query models on CPUs without AVX-512 (the last sequence of a batch)")


def forward_attention(attn: str | None, device: str) -> tuple[str | None, str | None]:
    """The attention a forward-only use (eval, generate) loads on `device`, and a note when it isn't the recipe's:
    flex_attention on CPU can't be trusted (FLEX_CPU); sdpa computes the same attention with the same masks."""
    if attn == "flex_attention" and device != "cuda":
        return "sdpa", f"model.attn_implementation flex_attention -> sdpa on {device}: {FLEX_CPU}"
    return attn, None


def kernels(recipe: Recipe, device: str) -> list[Problem]:
    """Kernels that need CUDA or an optional package: Liger, flash-attention, inductor's C++ compiler on CPU."""
    import shutil

    found: list[Problem] = []
    t, m = recipe.train, recipe.model
    if t.kernels == "liger":
        found += _cuda_lever(device, "liger_kernel", "train.kernels",
                             ("Liger kernels are Triton GPU kernels; this run is on CPU",
                              "set `train.kernels: none` on CPU (`train.tiled_loss: true` keeps Liger's saving of "
                              "the logits' memory on any device)"),
                             ("train.kernels: liger needs the liger-kernel package, which is not installed",
                              "pip install 'ftune[kernels]'   (liger-kernel), or `train.kernels: none` with "
                              "`train.tiled_loss: true` for the loss's memory saving"))
    if m.attn_implementation == "flash_attention_2":
        found += _cuda_lever(device, "flash_attn", "model.attn_implementation",
                             ("flash_attention_2 runs on CUDA GPUs only; this run is on CPU",
                              "use `model.attn_implementation: sdpa` on CPU"),
                             ("flash_attention_2 needs the flash-attn package, which is not installed",
                              "pip install flash-attn --no-build-isolation   (or use `model.attn_implementation: "
                              "sdpa`)"))
    rl = t.rl if family_of(recipe).generates else None
    if rl is not None and rl.generation.backend == "vllm":
        found += _cuda_lever(device, "vllm", "train.rl.generation.backend",
                             ("vLLM generates on CUDA GPUs only; this run is on CPU",
                              "use `train.rl.generation.backend: transformers` on CPU"),
                             ("backend vllm needs the vllm package, which is not installed",
                              "pip install vllm   (a build matching this torch), or use `backend: transformers`"))
    if m.attn_implementation == "flex_attention" and device != "cuda":
        found.append(Problem.at("model.attn_implementation", f"flex_attention can't train on {device}: {FLEX_CPU}",
                                "use `model.attn_implementation: sdpa` on CPU (the same packed-sequence masks)"))
    if t.compile and (t.compile_backend or "inductor") == "inductor" and device == "cpu" \
            and not any(shutil.which(cc) for cc in ("cc", "gcc", "clang")):
        found.append(Problem.at("train.compile", "torch.compile's inductor backend generates C++ on CPU, and no C "
                                "compiler (cc, gcc, clang) is on PATH", "install gcc, or set "
                                "`train.compile_backend: aot_eager`"))
    return found


def _cuda_lever(device: str, package: str, key: str, on_cpu: tuple[str, str],
                missing: tuple[str, str]) -> list[Problem]:
    """A lever that runs on CUDA only and needs `package`: refused at `key` off CUDA (`on_cpu`: message, hint),
    then where the package is not installed (`missing`)."""
    if device != "cuda":
        return [Problem.at(key, *on_cpu)]
    if importlib.util.find_spec(package) is None:
        return [Problem.at(key, *missing)]
    return []


def devices(recipe: Recipe, device: str, num_processes: int) -> list[Problem]:
    """GPUs and the distributed packages (the config files the distributed section names: `ftune.plan.checks.paths`)."""
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
    return found + qat.environment_problems(recipe, device)
