"""Quantized loading with bitsandbytes (QLoRA): config, pre-launch checks, k-bit preparation, the CPU guard.

The base model is loaded 4-bit (nf4/fp4) or 8-bit and frozen; LoRA trains on top. Light to import:
bitsandbytes, torch, transformers and peft are imported inside functions only (bitsandbytes alone
costs seconds). Facts measured with bitsandbytes 0.50 on CPU that shape this module:

- An eval-mode forward under no_grad on an AVX512-BF16 CPU repacks 4-bit weights for inference,
  after which the base layers pass no gradient: training goes on silently wrong. `guard` turns the
  repacking off, so evaluation (at any step) and generation are safe on a guarded model.
- That repacking asserts every quantized linear's dimensions are multiples of 32; `check_model_config`
  refuses other shapes on CPU before any weight loads.
- Paged optimizers silently fall back to unpaged ones on CPU (paging moves state GPU <-> host).
"""

from __future__ import annotations

import importlib.util
import json
import math
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from ftune.errors import FtuneError

if TYPE_CHECKING:
    from ftune.recipe.schema import QuantizationSection, Recipe

INSTALL_HINT = "pip install 'ftune[quant]'   (bitsandbytes >= 0.45)"
MIN_BNB = (0, 45)
CPU_BLOCK = 32
"""bitsandbytes' CPU 4-bit kernels work on 32-wide blocks of every quantized linear dimension."""
HEADS = ("lm_head", "score", "classifier")
"""Usual output-head names, kept unquantized also when `skip_modules` is set (transformers would drop them)."""

# transformers `optim` names that run on bitsandbytes.
BNB_OPTIMIZERS = frozenset({
    "adamw_bnb_8bit", "adamw_8bit", "ademamix", "ademamix_8bit", "lion_8bit", "lion_32bit",
    "paged_adamw_32bit", "paged_adamw_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit",
    "paged_lion_32bit", "paged_lion_8bit", "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit",
})
RECORD_FILE = "ftune.json"
"""final/ftune.json (written by the save stage) records the `quantization` section the adapter was trained on."""

Problem = tuple[str, str, str]
"""(dotted recipe path, message, hint) — the plan compiler turns it into a located error."""


# ------------------------------------------------------------------------------ plan-time checks
def needs_bitsandbytes(recipe: Recipe) -> bool:
    return recipe.quantization is not None or recipe.train.optimizer in BNB_OPTIMIZERS


def check_environment(recipe: Recipe) -> list[str]:
    """Problems with the installed bitsandbytes, for a recipe that needs it (checked without importing it)."""
    if not needs_bitsandbytes(recipe):
        return []
    why = (f"quantization.bits: {recipe.quantization.bits}" if recipe.quantization is not None
           else f"train.optimizer: {recipe.train.optimizer}")
    if importlib.util.find_spec("bitsandbytes") is None:
        return [f"{why} needs bitsandbytes, which is not installed"]
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("bitsandbytes")
    except PackageNotFoundError:  # importable but not installed as a distribution (a source checkout)
        return []
    if tuple(int(p) for p in found.split(".")[:2] if p.isdigit()) < MIN_BNB:
        return [f"{why} needs bitsandbytes >= {'.'.join(map(str, MIN_BNB))}, found {found}"]
    return []


def check_device(recipe: Recipe, device: str) -> list[Problem]:
    """Options that only do something on CUDA, refused on a CPU run instead of silently ignored."""
    found: list[Problem] = []
    opt = recipe.train.optimizer
    if device == "cpu" and opt.startswith("paged_"):
        found.append((
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
        model, skip_patterns(recipe.quantization), getattr(model, "_keep_in_fp32_modules", None)
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


def check_model_config(recipe: Recipe, config, device: str = "cpu") -> list[Problem]:
    """Shapes the CPU 4-bit kernels can't run, found on the meta model before any weight loads.

    `config` is the model's config (a meta model is built from it) or an already built (meta) model.
    """
    q = recipe.quantization
    if q is None or q.bits != 4 or device != "cpu":
        return []
    model = config if hasattr(config, "named_modules") else _meta_model(recipe, config)
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
    return [(
        "quantization.bits",
        f"4-bit on CPU needs every quantized linear's in/out dimension divisible by {CPU_BLOCK}; "
        f"{recipe.model.path} has {shown}",
        hint,
    )]


def _dims(bad: dict[str, tuple[int, int]], leaf: str) -> str:
    shapes = sorted({dims for n, dims in bad.items() if n.rpartition(".")[2] == leaf})
    return ", ".join(f"{i}x{o}" for i, o in shapes)


def _meta_model(recipe: Recipe, config):
    import transformers
    from accelerate import init_empty_weights

    from ftune.worker.model import TASK_CLASSES

    cls = getattr(transformers, TASK_CLASSES[recipe.model.task])
    with init_empty_weights():
        return cls.from_config(config, trust_remote_code=recipe.model.trust_remote_code)


# ---------------------------------------------------------------------------------- worker side
def config_from_section(q: QuantizationSection | None):
    """transformers.BitsAndBytesConfig for a `quantization` section (None when there is none)."""
    if q is None:
        return None
    import torch
    from transformers import BitsAndBytesConfig

    if q.bits == 8:
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=skip_patterns(q))
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=q.type,
        bnb_4bit_use_double_quant=q.double_quant,
        bnb_4bit_compute_dtype=getattr(torch, q.compute_dtype),
        bnb_4bit_quant_storage=getattr(torch, q.quant_storage),
        llm_int8_skip_modules=skip_patterns(q),
    )


def quantization_config(recipe: Recipe):
    """The BitsAndBytesConfig passed to `from_pretrained`, or None for an unquantized recipe."""
    return config_from_section(recipe.quantization)


def prepare(model, recipe: Recipe):
    """Freeze the quantized base and make it trainable under adapters; returns the model.

    Without FSDP this is peft's `prepare_model_for_kbit_training` (norms and the head upcast to fp32,
    input grads, gradient checkpointing as `train.gradient_checkpointing` says). FSDP needs one dtype
    per sharded unit, so there the fp32 upcast is skipped.
    """
    gc = recipe.train.gradient_checkpointing
    gc_kwargs = {"use_reentrant": False}
    if recipe.distributed.strategy == "fsdp":
        for p in model.parameters():
            p.requires_grad_(False)
        if gc:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gc_kwargs)
    else:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=gc, gradient_checkpointing_kwargs=gc_kwargs
        )
    if gc and getattr(model, "config", None) is not None:
        model.config.use_cache = False
    guard(model, recipe)
    return model


def guard(model, recipe: Recipe | None = None) -> int:
    """Keep bitsandbytes from repacking 4-bit weights for CPU inference; returns the layers guarded (`recipe`
    is unused: any 4-bit model is guarded the same way).

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


def weight_bytes(model) -> dict[str, int]:
    """Bytes the base weights hold: quantized (data + quantization constants), other, and the logical params.

    Adapter parameters injected by peft are left out: this is the frozen base, as loaded and prepared."""
    quantized = other = params = layers = 0
    adapters = _adapter_param_ids(model)
    for p in {id(p): p for p in model.parameters()}.values():
        if id(p) in adapters:
            continue
        kind = type(p).__name__
        nbytes = _nbytes(p)
        if kind == "Params4bit" and p.quant_state is not None:
            qs = p.quant_state
            nbytes += _nbytes(qs.absmax) + _nbytes(qs.code)
            if qs.nested and qs.state2 is not None:
                nbytes += _nbytes(qs.state2.absmax) + _nbytes(qs.state2.code) + 4  # + the fp32 offset
            params += math.prod(int(d) for d in qs.shape)
        elif kind == "Int8Params":
            nbytes += _nbytes(getattr(p, "SCB", None))
            params += p.numel()
        else:
            params += p.numel()
            other += nbytes
            continue
        quantized += nbytes
        layers += 1
    return {"quantized": quantized, "other": other, "params": params, "layers": layers}


def _adapter_param_ids(model) -> set[int]:
    """Parameters peft injected (lora_A/B, ...): not part of the base's weight memory."""
    ids: set[int] = set()
    for module in model.modules():
        for attr in getattr(module, "adapter_layer_names", ()):
            sub = getattr(module, attr, None)
            if sub is not None and hasattr(sub, "parameters"):
                ids |= {id(p) for p in sub.parameters()}
    return ids


def estimate_bytes(recipe: Recipe, model) -> dict[str, int]:
    """`weight_bytes` predicted on the meta model, by bitsandbytes' layout (blocks of 64, 16/256-entry codes).

    Unquantized weights count as fp32 (k-bit preparation upcasts them) except under FSDP (model dtype).
    """
    q = recipe.quantization
    names = set(quantized_linears(recipe, model))
    fsdp = recipe.distributed.strategy == "fsdp"
    loaded = {"float32": 4, "bfloat16": 2, "float16": 2}.get(recipe.model.dtype)

    def itemsize(p) -> int:
        return (loaded or p.element_size()) if fsdp else 4

    quantized = other = params = 0
    for name, module in model.named_modules():
        if name in names:
            n = module.in_features * module.out_features
            if q.bits == 8:
                quantized += n + 4 * module.out_features  # int8 data + fp32 row scales (SCB)
            else:
                blocks = -(-n // 64)
                absmax = blocks + 4 * -(-blocks // 256) + 1024 + 4 if q.double_quant else 4 * blocks
                quantized += (n + 1) // 2 + absmax + 64
            params += n
            if getattr(module, "bias", None) is not None:
                other += module.bias.numel() * itemsize(module.bias)
                params += module.bias.numel()
            continue
        for p in module.parameters(recurse=False):
            params += p.numel()
            other += p.numel() * itemsize(p)
    return {"quantized": quantized, "other": other, "params": params, "layers": len(names)}


def _nbytes(t) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def describe(recipe: Recipe, model) -> dict:
    """Weight memory of the quantized model against the same model in bf16, for the plan and the summary.

    Measured on a loaded model; predicted (`estimated: true`) on a meta-device model, as `ftune plan` has.
    """
    q = recipe.quantization
    on_meta = any(p.device.type == "meta" for p in model.parameters())
    b = estimate_bytes(recipe, model) if on_meta and q is not None else weight_bytes(model)
    total = b["quantized"] + b["other"]
    bf16 = 2 * b["params"]
    return {
        "bits": q.bits if q else None,
        "type": (q.type if q.bits == 4 else "int8") if q else None,
        "estimated": on_meta,
        "quantized_layers": b["layers"],
        "quantized_weight_bytes": b["quantized"],
        "other_weight_bytes": b["other"],
        "weight_bytes": total,
        "bf16_weight_bytes": bf16,
        "ratio_vs_bf16": round(total / bf16, 4) if bf16 else None,
    }


def describe_line(info: dict) -> str:
    """`describe` in one line for the plan and the summary: '4-bit nf4: 4187.26 MiB weights vs 12852.51 MiB in bf16
    (0.33x)' (Llama-2-7B, double quant)."""
    mib = 1024 * 1024
    return (f"{info['bits']}-bit {info['type']}: {info['weight_bytes'] / mib:.2f} MiB weights vs "
            f"{info['bf16_weight_bytes'] / mib:.2f} MiB in bf16 ({info['ratio_vs_bf16']:.2f}x)")


# ------------------------------------------------------------------------------------- reloading
def recorded_quantization(final_dir: str | Path) -> QuantizationSection | None:
    """The `quantization` section recorded in final/ftune.json, or None for an unquantized run."""
    from ftune.recipe.schema import QuantizationSection

    path = Path(final_dir) / RECORD_FILE
    if not path.is_file():
        raise FtuneError(f"{path} not found: {final_dir} is not a finished ftune run's final/ folder",
                         hint="point at <run dir>/final of a completed `ftune run`")
    data = json.loads(path.read_text()).get("quantization")
    return None if data is None else QuantizationSection.model_validate(data)


def prepare_for_eval(model, recipe: Recipe):
    """A freshly loaded quantized base made numerically like the training one: guarded, and its other
    weights upcast to fp32 as k-bit preparation did (kept in the model dtype under FSDP). Eval mode."""
    guard(model, recipe)
    if recipe.distributed.strategy != "fsdp":
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

    from ftune.worker.model import TASK_CLASSES

    q = recorded_quantization(final_dir)
    meta = json.loads((Path(final_dir) / RECORD_FILE).read_text())
    cls = getattr(transformers, TASK_CLASSES[task or meta.get("task", "causal-lm")])
    base = cls.from_pretrained(
        str(base_path or meta["base_model"]),
        quantization_config=config_from_section(q),
        dtype="auto" if dtype == "auto" else getattr(torch, dtype),
    )
    guard(base)
    if upcast:
        _upcast(base)
    return PeftModel.from_pretrained(base, str(final_dir)).eval()
