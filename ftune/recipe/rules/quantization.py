"""Quantization rules: bitsandbytes 4/8-bit options that can't work together, refused before any weight loads.

Elsewhere: quantization with `full`/`freeze` is refused in `core.py`, 8-bit with FSDP in `distributed.py`;
checks that need the installed packages, the device or the model's shapes live in `ftune.plan.quantization`.
"""

from __future__ import annotations

from collections.abc import Iterator

from ftune.errors import Problem
from ftune.recipe.rules import Rule
from ftune.recipe.schema import Recipe


def _shards_4bit(recipe: Recipe) -> str | None:
    """'FSDP' / 'DeepSpeed ZeRO-3' when the run shards a 4-bit base (flat params need one dtype), else None."""
    d = recipe.distributed
    if d.strategy == "fsdp":
        return "FSDP"
    if d.strategy == "deepspeed" and d.deepspeed is not None and d.deepspeed.stage == 3:
        return "DeepSpeed ZeRO-3"
    return None


def sharded_qlora_quant_storage(recipe: Recipe) -> Iterator[Problem]:
    q = recipe.kbit
    how = _shards_4bit(recipe)
    if q is None or q.bits != 4 or how is None:
        return
    dtype = recipe.model.dtype
    if dtype == "auto":
        yield Problem.at(
            "model.dtype",
            f"{how} + QLoRA needs an explicit model.dtype that quantization.quant_storage matches "
            f"(model.dtype is '{dtype}')",
            "set `model.dtype: bfloat16` and `quantization.quant_storage: bfloat16`",
        )
    elif q.quant_storage != dtype:
        yield Problem.at(
            "quantization.quant_storage",
            f"{how} + QLoRA needs quant_storage equal to model.dtype so packed 4-bit weights shard with the "
            f"rest; got quant_storage '{q.quant_storage}', model.dtype '{dtype}'",
            f"set `quantization.quant_storage: {dtype}`",
        )


def four_bit_only_options(recipe: Recipe) -> Iterator[Problem]:
    q = recipe.kbit
    if q is None or q.bits != 8:
        return
    fields = q.model_fields_set
    for key, default in (("type", "nf4"), ("double_quant", False), ("quant_storage", "uint8"),
                         ("compute_dtype", "bfloat16")):
        value = getattr(q, key)
        if key in fields and value != default:
            shown = str(value).lower() if isinstance(value, bool) else value
            yield Problem.at(
                f"quantization.{key}",
                f"`{key}: {shown}` applies to 4-bit quantization only; with bits 8 it would be ignored",
                f"remove `quantization.{key}`, or set `quantization.bits: 4`",
            )


def quantized_needs_pretrained(recipe: Recipe) -> Iterator[Problem]:
    if recipe.kbit is not None and recipe.model.init == "random":
        yield Problem.at(
            "quantization",
            "a quantized base is frozen, so quantizing a randomly initialised model (model.init: random) "
            "trains adapters on noise",
            "remove `quantization` to train from scratch, or use `model.init: pretrained`",
        )


def upcast_fits_sharding(recipe: Recipe) -> Iterator[Problem]:
    q = recipe.kbit
    how = _shards_4bit(recipe)
    if q is not None and q.upcast_non_quantized and how is not None:
        yield Problem.at("quantization.upcast_non_quantized", f"{how} shards every weight in one dtype, so the "
                         "unquantized weights can't be upcast to fp32", "remove `upcast_non_quantized` (or set false)")


RULES: list[Rule] = [sharded_qlora_quant_storage, four_bit_only_options, quantized_needs_pretrained,
                     upcast_fits_sharding]


# ------------------------------------------------------------------------------------- quantization.qat
BNB_KEYS = {"type": "nf4", "double_quant": False, "compute_dtype": "bfloat16", "quant_storage": "uint8",
            "skip_modules": None, "upcast_non_quantized": None}
"""The bitsandbytes keys of the section, with their defaults: set beside `qat` alone they would do nothing."""


def bits_or_qat(recipe: Recipe) -> Iterator[Problem]:
    q = recipe.quantization
    if q is None:
        return
    if q.bits is None and q.qat is None:
        yield Problem.at("quantization", "the quantization section needs `bits` (a bitsandbytes base, QLoRA) or "
                         "`qat` (quantization-aware training)", "add `bits: 4`, or `qat: {scheme: int4-weight}`")
    elif q.bits is not None and q.qat is not None:
        yield Problem.at("quantization.qat", "`qat` trains full-precision weights through fake quantization, and "
                         f"`bits: {q.bits}` freezes a bitsandbytes-quantized base: one or the other",
                         "remove `quantization.bits` (QAT), or `quantization.qat` (QLoRA)")
    elif q.bits is None:
        for key, default in BNB_KEYS.items():
            if key in q.model_fields_set and getattr(q, key) != default:
                yield Problem.at(f"quantization.{key}", f"`{key}` configures a bitsandbytes base (`bits`); with "
                                 "`qat` alone it would be ignored", f"remove `quantization.{key}`")


def qat_trains_whole_layers(recipe: Recipe) -> Iterator[Problem]:
    """QAT under LoRA would train Q(W)x + BAx, while the model `ftune merge` quantizes is Q(W + BA)x: the
    adapter's learning would not survive the convert. Refused until a merged-weight fake quantizer exists."""
    if recipe.qat is not None and recipe.peft.uses_peft_library:
        yield Problem.at("quantization.qat", f"QAT with `peft.method: {recipe.peft.method}` is not supported: fake "
                         "quantization of the base alone trains Q(W)x + BAx, but the merged model is quantized as "
                         "Q(W + BA)x, so what the adapter learned would not survive the conversion",
                         "use `peft.method: full` (or `freeze`) with quantization.qat")


def qat_group_size(recipe: Recipe) -> Iterator[Problem]:
    qat = recipe.qat
    if qat is None:
        return
    if qat.scheme == "fp8":
        if "group_size" in qat.model_fields_set:
            yield Problem.at("quantization.qat.group_size", "fp8 scales per row, not per group of inputs: "
                             "`group_size` would be ignored", "remove `quantization.qat.group_size`")
    elif qat.group_size & (qat.group_size - 1):
        low = 1 << (qat.group_size.bit_length() - 1)
        yield Problem.at("quantization.qat.group_size", f"group_size must be a power of two, got {qat.group_size}",
                         f"use {low} or {low * 2}")


def qat_single_process_layout(recipe: Recipe) -> Iterator[Problem]:
    """Fake-quantized linears are tested unsharded (one process, DDP); sharding them is not."""
    strategy = recipe.distributed.strategy
    if recipe.qat is not None and strategy in ("fsdp", "deepspeed"):
        yield Problem.at("distributed.strategy", f"quantization.qat with `{strategy}` is not supported (torchao's "
                         "fake-quantized linears are run unsharded here)", "use `distributed.strategy: ddp` or none")
    if recipe.qat is not None and recipe.train.max_steps is not None \
            and recipe.qat.start_after_steps >= recipe.train.max_steps:
        yield Problem.at("quantization.qat.start_after_steps", f"start_after_steps ({recipe.qat.start_after_steps}) "
                         f"is not below train.max_steps ({recipe.train.max_steps}): no step would train quantized",
                         "lower start_after_steps (0: from the first step)")


RULES += [bits_or_qat, qat_trains_whole_layers, qat_group_size, qat_single_process_layout]
