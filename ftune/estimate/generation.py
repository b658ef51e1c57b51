"""The KV cache an online RL run holds while it generates (`train.rl.generation`): keys and values of every layer
for the batch of completions (layers x 2 x kv_heads x head_dim x bytes x tokens). For backend paged, the tokens
are the paged cache the Plan sizes (`ftune.plan.paged`: blocks x page); for transformers, the padded batch's rows
(prompt + completion each). Generation runs between training steps: the weights and optimizer states are resident,
the activations are not, so its peak is the resident memory plus this cache."""

from __future__ import annotations

from dataclasses import dataclass

from ftune.models.meta import DTYPES
from ftune.plan.paged import generation_batch, kv_bytes
from ftune.recipe.schema import Recipe


@dataclass(frozen=True)
class GenerationMemory:
    backend: str
    tokens: int
    """Tokens of cache per layer (the paged blocks x page, or completions x row)."""
    bytes: int
    detail: str


def generation_memory(recipe: Recipe, config, dtype: str) -> GenerationMemory | None:
    """The KV cache of one process's generation batch (None: no RL objective, or vLLM, which sizes its own)."""
    batch = generation_batch(recipe)
    if batch is None or batch.backend == "vllm":
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    # bf16/fp16 autocast computes K and V in half precision (TRL also casts the model for the paged path)
    itemsize = 2 if recipe.train.mixed_precision != "no" else DTYPES[dtype]
    layers = text.num_hidden_layers
    size = kv_bytes(layers, kv_heads, head_dim, itemsize, batch.cache_tokens)
    detail = (f"{layers} layers x 2 x {kv_heads} kv heads x {head_dim} x {itemsize} B x {batch.cache_tokens:,} tokens"
              f" ({batch.describe()})")
    if any(t == "sliding_attention" for t in getattr(text, "layer_types", None) or ()):
        detail += "; sliding-window layers counted in full (an upper bound)"
    return GenerationMemory(batch.backend, batch.cache_tokens, size, detail)
