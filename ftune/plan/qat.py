"""Quantization-aware training (`quantization.qat`), decided before launch: whether torchao can run the scheme on
this machine, and whether the model's linear layers fit its groups. One place decides what this machine can run
(`runnable`), each branch forced in tests/unit/test_qat.py; the worker and `ftune merge` only carry it out.

Measured with torchao 0.18 on torch 2.13 (CPU): int4-weight and int8-dynamic-act-int4-weight fake-quantize, train,
convert (`IntxWeightOnlyConfig` / `Int8DynamicActivationIntxWeightConfig`, int4 unpacked to int8) and reload
through transformers' TorchAoConfig on CPU, the converted logits equal to the fake-quantized ones. fp8 needs
float8 matmuls (`torch._scaled_mm`), which need a GPU of compute capability 8.9 or newer.

Light to import: torch and torchao are imported inside functions only.
"""

from __future__ import annotations

import importlib.util
from functools import reduce
from math import gcd
from typing import TYPE_CHECKING

from ftune.errors import Problem

if TYPE_CHECKING:
    from ftune.recipe.schema import Recipe

INSTALL_HINT = "pip install 'ftune[qat]'   (torchao >= 0.18)"
MIN_TORCHAO = (0, 18)
FP8_CAPABILITY = (8, 9)
"""float8 matmuls (torch._scaled_mm, e4m3) need Ada or Hopper or newer."""


def cuda_capability() -> tuple[int, int] | None:
    """This machine's first GPU's compute capability, None without one."""
    import torch

    return tuple(torch.cuda.get_device_capability(0)) if torch.cuda.is_available() else None


def runnable(scheme: str, device: str, capability: tuple[int, int] | None) -> str | None:
    """Why torchao can't run `scheme` on this machine (device 'cpu'/'cuda', the GPU's compute capability), or
    None when it can. The one decision: `environment_problems` and the tests ask here."""
    if scheme != "fp8":
        return None  # the int4 schemes run on CPU and GPU (int4 stored unpacked in int8, torchao's CPU path)
    if device != "cuda" or capability is None:
        return "fp8 needs a GPU with float8 matmuls (compute capability 8.9+: Ada, Hopper); this machine has none"
    if tuple(capability) < FP8_CAPABILITY:
        return (f"fp8 needs float8 matmuls (compute capability 8.9+: Ada, Hopper); this GPU has "
                f"{capability[0]}.{capability[1]}")
    return None


def _version(found: str) -> tuple[int, ...]:
    return tuple(int(p) for p in found.split(".")[:2] if p.isdigit())


def environment_problems(recipe: Recipe, device: str, capability: tuple[int, int] | None | str = "detect"
                         ) -> list[Problem]:
    """torchao installed (checked without importing it) and the scheme runnable here, located at the key."""
    qat = recipe.qat
    if qat is None:
        return []
    if importlib.util.find_spec("torchao") is None:
        return [Problem.at("quantization.qat", "quantization.qat needs torchao, which is not installed", INSTALL_HINT)]
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("torchao")
    except PackageNotFoundError:
        found = None
    if found is not None and _version(found) < MIN_TORCHAO:
        return [Problem.at("quantization.qat", f"quantization.qat needs torchao >= 0.18 (its QATConfig), found {found}",
                           INSTALL_HINT)]
    if capability == "detect":
        capability = cuda_capability() if device == "cuda" else None
    why = runnable(qat.scheme, device, capability)
    if why is None:
        return []
    return [Problem.at("quantization.qat.scheme", why, "use `scheme: int4-weight` or `int8-dynamic-act-int4-weight` "
                       "here, or run fp8 on an H100/H200/L4-class GPU")]


def quantized_linears(model) -> dict[str, int]:
    """Name -> input size of every linear layer QAT fake-quantizes: all of them but the output head (kept in full
    precision, as transformers' TorchAoConfig keeps it when `ftune merge` converts)."""
    import torch

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    heads = {id(head)} if head is not None else set()
    return {name: m.in_features for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and id(m) not in heads and not name.endswith(("score", "classifier"))}


def model_problems(recipe: Recipe, model) -> list[Problem]:
    """Linear layers whose input size the int4 groups don't divide (torchao would refuse them after launch)."""
    qat = recipe.qat
    if qat is None or qat.scheme == "fp8":
        return []
    bad = sorted({(n.rpartition(".")[2], k) for n, k in quantized_linears(model).items() if k % qat.group_size})
    if not bad:
        return []
    shown = ", ".join(f"{leaf} ({k} inputs)" for leaf, k in bad)
    common = reduce(gcd, quantized_linears(model).values())
    fits = min(common & -common, 256)  # the largest power of two dividing every input size
    return [Problem.at("quantization.qat.group_size", f"group_size {qat.group_size} must divide the input size of "
                       f"every quantized linear layer; {recipe.model.path} has {shown}",
                       f"use `group_size: {fits}`")]
