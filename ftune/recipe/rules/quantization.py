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
    q = recipe.quantization
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
    q = recipe.quantization
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
    if recipe.quantization is not None and recipe.model.init == "random":
        yield Problem.at(
            "quantization",
            "a quantized base is frozen, so quantizing a randomly initialised model (model.init: random) "
            "trains adapters on noise",
            "remove `quantization` to train from scratch, or use `model.init: pretrained`",
        )


def upcast_fits_sharding(recipe: Recipe) -> Iterator[Problem]:
    q = recipe.quantization
    how = _shards_4bit(recipe)
    if q is not None and q.upcast_non_quantized and how is not None:
        yield Problem.at("quantization.upcast_non_quantized", f"{how} shards every weight in one dtype, so the "
                         "unquantized weights can't be upcast to fp32", "remove `upcast_non_quantized` (or set false)")


RULES: list[Rule] = [sharded_qlora_quant_storage, four_bit_only_options, quantized_needs_pretrained,
                     upcast_fits_sharding]
