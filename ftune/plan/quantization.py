"""Quantization decided before launch: the bitsandbytes config the model is loaded with, and the checks that
need the installed packages, the device, or the model's shapes (on the meta device), each a `Problem`.

Light to import: bitsandbytes, torch and transformers are imported inside functions only. Facts measured
with bitsandbytes 0.50 on CPU (docs/qlora.md):
- An eval-mode forward on an AVX512-BF16 CPU repacks 4-bit weights and asserts every quantized linear's
  dimensions are multiples of 32; `check_model_config` refuses other shapes on CPU before any weight loads.
- Paged optimizers silently fall back to unpaged ones on CPU (paging moves state GPU <-> host).
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

from ftune.errors import Problem
from ftune.recipe.trainer_names import BNB_OPTIMIZERS

if TYPE_CHECKING:
    from ftune.recipe.schema import QuantizationSection, Recipe

INSTALL_HINT = "pip install 'ftune[quant]'   (bitsandbytes >= 0.45)"
MIN_BNB = (0, 45)
CPU_BLOCK = 32
"""bitsandbytes' CPU 4-bit kernels work on 32-wide blocks of every quantized linear dimension."""
HEADS = ("lm_head", "score", "classifier")
"""Usual output-head names, kept unquantized also when `skip_modules` is set (transformers would drop them)."""


def bnb_config(q: QuantizationSection | None) -> dict[str, Any] | None:
    """The `quantization_config` passed to `from_pretrained` (transformers reads this dict as a BitsAndBytesConfig),
    or None for an unquantized recipe."""
    if q is None:
        return None
    if q.bits == 8:
        return {"quant_method": "bitsandbytes", "load_in_8bit": True, "llm_int8_skip_modules": skip_patterns(q)}
    return {
        "quant_method": "bitsandbytes",
        "load_in_4bit": True,
        "bnb_4bit_quant_type": q.type,
        "bnb_4bit_use_double_quant": q.double_quant,
        "bnb_4bit_compute_dtype": q.compute_dtype,
        "bnb_4bit_quant_storage": q.quant_storage,
        "llm_int8_skip_modules": skip_patterns(q),
    }


def upcasts(recipe: Recipe) -> bool:
    """Whether k-bit preparation upcasts the unquantized weights to fp32: `quantization.upcast_non_quantized`,
    by default peft's upcast except under FSDP (one dtype per shard). The worker and the estimate both ask here."""
    q = recipe.kbit
    if q is not None and q.upcast_non_quantized is not None:
        return q.upcast_non_quantized
    return recipe.distributed.strategy != "fsdp"


def needs_bitsandbytes(recipe: Recipe) -> bool:
    return recipe.kbit is not None or recipe.train.optimizer in BNB_OPTIMIZERS


def check_environment(recipe: Recipe) -> list[Problem]:
    """Problems with the installed bitsandbytes, for a recipe that needs it (checked without importing it)."""
    if not needs_bitsandbytes(recipe):
        return []
    quantized = recipe.kbit is not None
    where = "quantization" if quantized else "train.optimizer"
    why = f"quantization.bits: {recipe.kbit.bits}" if quantized else f"train.optimizer: {recipe.train.optimizer}"
    if importlib.util.find_spec("bitsandbytes") is None:
        return [Problem.at(where, f"{why} needs bitsandbytes, which is not installed", INSTALL_HINT)]
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("bitsandbytes")
    except PackageNotFoundError:  # importable but not installed as a distribution (a source checkout)
        return []
    if tuple(int(p) for p in found.split(".")[:2] if p.isascii() and p.isdigit()) < MIN_BNB:
        return [Problem.at(where, f"{why} needs bitsandbytes >= {'.'.join(map(str, MIN_BNB))}, found {found}",
                           INSTALL_HINT)]
    return []


def check_device(recipe: Recipe, device: str) -> list[Problem]:
    """Options that only do something on CUDA, refused on a CPU run instead of silently ignored."""
    found: list[Problem] = []
    opt = recipe.train.optimizer
    if device == "cpu" and opt.startswith("paged_"):
        found.append(Problem.at(
            "train.optimizer",
            f"'{opt}' pages optimizer state between GPU and host memory; on CPU bitsandbytes silently "
            "runs it unpaged",
            f"use `train.optimizer: {opt.removeprefix('paged_')}` (same optimizer, unpaged) on CPU",
        ))
    return found


def quantized_linears(recipe: Recipe, model) -> dict[str, tuple[int, int]]:
    """Name -> (in, out) of every linear layer bitsandbytes will quantize, decided exactly as transformers does."""
    import torch
    from transformers.quantizers.base import HfQuantizer
    from transformers.quantizers.quantizers_utils import should_convert_module

    skip = HfQuantizer.get_modules_to_not_convert(
        model, skip_patterns(recipe.kbit), getattr(model, "_keep_in_fp32_modules", None)
    )
    found = {}
    for name, module in model.named_modules():
        if type(module) is torch.nn.Linear and should_convert_module(name, skip):
            found[name] = (module.in_features, module.out_features)
    return found


def skip_patterns(q: QuantizationSection) -> list[str] | None:
    """`llm_int8_skip_modules`: None keeps transformers' default (the output head and tied weights);
    the recipe's skip_modules are added to the usual head names, so a listed module never unskips the head."""
    if not q.skip_modules:
        return None
    return sorted({*q.skip_modules, *HEADS})


def fused_expert_problems(recipe: Recipe, model) -> list[Problem]:
    """QLoRA on an MoE model: bitsandbytes quantizes nn.Linear layers only, so the fused [experts, ...] tensors,
    most of the model, would stay in 16-bit: a "4-bit" run that needs nearly the memory of a 16-bit one."""
    if recipe.kbit is None:
        return []
    from ftune.models.moe import count

    counts = count(model)
    if counts is None:
        return []
    share = 100.0 * counts.experts / counts.total
    return [Problem.at(
        "quantization.bits",
        f"{recipe.model.path} is a mixture-of-experts model whose experts are fused [experts, ...] tensors "
        f"({share:.0f}% of its parameters); bitsandbytes quantizes only linear layers, so the experts would stay "
        f"unquantized and a {recipe.kbit.bits}-bit base would save little memory",
        "remove the quantization section (LoRA on the 16-bit base, with `distributed.strategy: fsdp` to shard it), "
        "or pick a dense model for QLoRA (docs/moe.md)",
    )]


def check_model_config(recipe: Recipe, config, device: str = "cpu") -> list[Problem]:
    """Shapes the CPU 4-bit kernels can't run, found on the meta model before any weight loads.

    `config` is the model's config (a meta model is built from it) or an already built (meta) model.
    """
    q = recipe.kbit
    if q is None or q.bits != 4 or device != "cpu":
        return []
    if not hasattr(config, "named_modules"):
        from ftune.models.meta import build_meta_model

        config = build_meta_model(recipe, config)
    model = config
    linears = quantized_linears(recipe, model)
    bad = {n: dims for n, dims in linears.items() if any(d % CPU_BLOCK for d in dims)}
    if not bad:
        return []
    leaves = sorted({n.rpartition(".")[2] for n in bad})
    shown = ", ".join(f"{leaf} ({_dims(bad, leaf)})" for leaf in leaves)
    hint = "use `quantization.bits: 8`, or run on a GPU"
    if len(bad) < len(linears):
        keep = sorted(set(q.skip_modules or []) | set(leaves))
        hint = f"keep them unquantized with `quantization.skip_modules: [{', '.join(keep)}]`, {hint}"
    return [Problem.at(
        "quantization.bits",
        f"4-bit on CPU needs every quantized linear's in/out dimension divisible by {CPU_BLOCK}; "
        f"{recipe.model.path} has {shown}",
        hint,
    )]


def _dims(bad: dict[str, tuple[int, int]], leaf: str) -> str:
    shapes = sorted({dims for n, dims in bad.items() if n.rpartition(".")[2] == leaf})
    return ", ".join(f"{i}x{o}" for i, o in shapes)
