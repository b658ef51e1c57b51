"""`quantization:` a bitsandbytes-quantized base (QLoRA) or quantization-aware training (torchao)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ftune.recipe.schema.base import Section


class QatSection(Section):
    """Quantization-aware training (torchao): the linear layers train through fake quantization, so the weights
    learn to survive the scheme `ftune merge` then quantizes them to for real (docs/quantization.md)."""

    scheme: Literal["int4-weight", "int8-dynamic-act-int4-weight", "fp8"]
    """int4-weight: int4 weights (symmetric, one scale per group of `group_size` inputs); int8-dynamic-act-int4-weight:
    the same weights with int8 activations quantized per token at run time; fp8: float8 (e4m3) weights and
    activations per row, only on GPUs with FP8 (compute capability 8.9+)."""
    group_size: int = Field(32, gt=0)
    """Inputs sharing one int4 weight scale (a power of two dividing every quantized layer's input size); smaller
    is more accurate and larger on disk. Not used by fp8."""
    start_after_steps: int = Field(0, ge=0)
    """Train this many steps unquantized first, then turn fake quantization on (0: from the first step)."""


class QuantizationSection(Section):
    bits: Literal[4, 8] | None = None
    """Load the base model in 4-bit (QLoRA) or 8-bit (bitsandbytes). Not with `qat`."""
    qat: QatSection | None = None
    """Train through fake quantization and export the truly quantized model (torchao); not with `bits`."""
    type: Literal["nf4", "fp4"] = "nf4"
    """4-bit data type."""
    double_quant: bool = False
    """Quantize the quantization constants too (4-bit only)."""
    compute_dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    """Dtype of the matmuls on dequantized weights."""
    quant_storage: Literal["uint8", "float32", "bfloat16", "float16"] = "uint8"
    """Storage dtype of packed 4-bit weights; for FSDP+QLoRA it must equal model.dtype."""
    skip_modules: list[str] | None = None
    """Modules left unquantized (e.g. lm_head)."""
    upcast_non_quantized: bool | None = None
    """k-bit preparation upcasts the unquantized weights (embeddings, norms, head) to fp32, as peft does; false
    keeps them in the loaded dtype (less memory). Default: peft's upcast, except under FSDP (one dtype per shard)."""
