"""A quantized base in any process that holds one: the CPU repacking guard, and the eval-time reload (the
recorded `quantization` section, the base made numerically like the training one).

Facts measured with bitsandbytes 0.50 on CPU: an eval-mode forward under no_grad on an AVX512-BF16 CPU repacks
4-bit weights for inference, after which the base layers pass no gradient, so training goes on silently wrong.
`guard` turns the repacking off, so evaluation (at any step) and generation are safe on a guarded model.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from ftune.adapter import RECORD  # final/ftune.json: the `quantization` section the adapter was trained on
from ftune.errors import FtuneError

if TYPE_CHECKING:
    from ftune.recipe.schema import QuantizationSection


def guard(model) -> int:
    """Keep bitsandbytes from repacking 4-bit weights for CPU inference; returns the layers guarded.

    Turns the repacking off on every 4-bit layer and undoes any repacking already done, so an eval or
    generation forward (before or during training) leaves gradients flowing. Idempotent; call it after
    loading and again before training. Repacked layers are unpacked (lossy: the packing rounded their
    block scales to bf16) with a warning; raises if a layer stays packed.
    """
    try:
        from bitsandbytes.functional import _convert_weight_packed_for_cpu_inverse
        from bitsandbytes.nn import Linear4bit
    except ImportError:  # no bitsandbytes, nothing quantized
        return 0
    n, repaired = 0, []
    for name, module in model.named_modules():
        if not isinstance(module, Linear4bit):
            continue
        module.support_avx512bf16_for_cpu = False
        weight = module.weight
        if getattr(weight.quant_state, "packing_format_for_cpu", False):
            # Best effort: the packing rounded the block scales to bf16, so the weights come back slightly off.
            weight.data, weight.quant_state = _convert_weight_packed_for_cpu_inverse(weight.data, weight.quant_state)
            if not weight.quant_state.nested:
                weight.quant_state.absmax = weight.quant_state.absmax.float()
            module.quant_state = weight.quant_state
            repaired.append(name)
        if getattr(weight.quant_state, "packing_format_for_cpu", False):
            raise FtuneError(
                f"4-bit layer {name} is packed for CPU inference; training it would pass no gradient",
                hint="report this with your bitsandbytes version; meanwhile use `quantization.bits: 8` on CPU",
            )
        n += 1
    if repaired:
        warnings.warn(f"bitsandbytes had packed {len(repaired)} 4-bit layers for CPU inference (an eval forward ran "
                      "before ftune's guard); unpacked them, with block scales rounded to bf16", stacklevel=2)
    return n


def recorded_quantization(final_dir: str | Path) -> QuantizationSection | None:
    """The `quantization` section recorded in final/ftune.json, or None for an unquantized run."""
    from ftune.recipe.schema import QuantizationSection

    path = Path(final_dir) / RECORD
    if not path.is_file():
        raise FtuneError(f"{path} not found: {final_dir} is not a finished ftune run's final/ folder",
                         hint="point at <run dir>/final of a completed `ftune run`")
    data = json.loads(path.read_text()).get("quantization")
    return None if data is None else QuantizationSection.model_validate(data)


def prepare_for_eval(model, *, upcast: bool):
    """A freshly loaded quantized base made numerically like the training one: guarded, and its other
    weights upcast to fp32 as k-bit preparation did (`upcast`; kept in the model dtype under FSDP). Eval mode."""
    guard(model)
    if upcast:
        _upcast(model)
    return model.eval()


def _upcast(model) -> None:
    import torch

    for p in model.parameters():
        if p.dtype in (torch.float16, torch.bfloat16) and type(p).__name__ != "Params4bit":
            p.data = p.data.float()


def load_for_eval(final_dir: str | Path, base_path: str | Path | None = None, task: str | None = None,
                  dtype: str = "auto", upcast: bool = True):
    """The trained adapter in `final_dir` on a freshly quantized base, as it was trained (eval mode).

    The base is requantized with the recorded section, guarded and upcast like the training model
    (`upcast=False` for FSDP runs), so its eval loss reproduces the one logged during the run.
    `base_path`/`task` default to the record; `dtype` is the recipe's model.dtype.
    """
    import torch
    import transformers
    from peft import PeftModel

    from ftune.models.config import TASK_CLASSES
    from ftune.plan.quantization import bnb_config

    q = recorded_quantization(final_dir)
    meta = json.loads((Path(final_dir) / RECORD).read_text())
    cls = getattr(transformers, TASK_CLASSES[task or meta.get("task", "causal-lm")])
    base = cls.from_pretrained(
        str(base_path or meta["base_model"]),
        quantization_config=bnb_config(q),
        dtype="auto" if dtype == "auto" else getattr(torch, dtype),
    )
    return PeftModel.from_pretrained(prepare_for_eval(base, upcast=upcast), str(final_dir)).eval()
