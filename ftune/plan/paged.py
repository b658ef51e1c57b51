"""The KV cache an RL run's generation holds, decided before launch: for `train.rl.generation.backend: paged`, the
paged cache transformers' continuous batching allocates (TRL's `transformers_continuous_batching_config`), sized
from the recipe instead of from the device's free memory at the first step; for the other backends, what the batch
of completions occupies. Light: no torch, no trl.

Transformers sizes an unsized paged cache to a share of the free memory (TRL: half of it; on a CPU, half of the
machine's RAM, zero-filled). ftune gives it exactly the blocks one generation batch needs: every completion of a
process's batch with its prompt, each request rounded up to whole pages.
"""

from __future__ import annotations

from dataclasses import dataclass

from ftune.recipe.objectives import family_of
from ftune.recipe.schema import Recipe

PAGE_TOKENS = 256
"""transformers' default page (tokens per layer per block); a shorter row gets a page of its length (a power of
two, at least MIN_PAGE), so a tiny run doesn't reserve 256 tokens a request."""
MIN_PAGE = 16
MAX_BATCH_TOKENS = 8192
"""transformers' default for the tokens one forward of the batch processes (prefill chunks and decode steps)."""
ASSUMED_PROMPT = 256
"""Prompt tokens assumed when data.max_prompt_length is unset (a longer prompt still runs: it waits for blocks)."""


@dataclass(frozen=True)
class GenerationBatch:
    backend: str
    completions: int
    """Completions one process generates at once (per_device_batch_size x gradient_accumulation_steps: TRL samples
    the whole generation batch of a step in one call)."""
    prompt_tokens: int
    prompt_assumed: bool
    completion_tokens: int
    page_size: int | None = None
    num_blocks: int | None = None

    @property
    def row_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def cache_tokens(self) -> int:
        """Tokens of KV cache held per layer: the paged cache's blocks x page, or the padded batch's rows."""
        if self.page_size is not None and self.num_blocks is not None:
            return self.page_size * self.num_blocks
        return self.completions * self.row_tokens

    def continuous_batching_config(self) -> dict[str, int]:
        """TRL's `transformers_continuous_batching_config` (kwargs of transformers' ContinuousBatchingConfig). No
        seed: transformers then draws one from torch's generator, which the trainer seeded (train.seed), so a run
        repeats; a fixed seed would reseed the global generator at every step."""
        assert self.page_size is not None and self.num_blocks is not None
        return {"page_size": self.page_size, "num_blocks": self.num_blocks,
                "max_batch_tokens": min(MAX_BATCH_TOKENS, self.completions * self.row_tokens)}

    def describe(self) -> str:
        prompt = f"{self.prompt_tokens}{' assumed' if self.prompt_assumed else ''}"
        rows = f"{self.completions} completions x ({prompt} prompt + {self.completion_tokens} completion tokens)"
        if self.page_size is None:
            return f"{rows}, one padded batch"
        return f"{rows} in {self.num_blocks} blocks of {self.page_size} tokens"


def generation_batch(recipe: Recipe) -> GenerationBatch | None:
    """One process's generation batch and, for backend paged, its cache in pages (None: no RL objective)."""
    rl = recipe.train.rl
    if rl is None or not family_of(recipe).generates:
        return None
    t, d = recipe.train, recipe.data
    completions = t.per_device_batch_size * t.gradient_accumulation_steps
    prompt = d.max_prompt_length or ASSUMED_PROMPT
    batch = GenerationBatch(rl.generation.backend, completions, prompt, d.max_prompt_length is None,
                            rl.max_completion_length)
    if rl.generation.backend != "paged":
        return batch
    row = batch.row_tokens
    page = PAGE_TOKENS if row >= PAGE_TOKENS else max(MIN_PAGE, 1 << (row - 1).bit_length())
    blocks = completions * -(-row // page)
    return GenerationBatch(**{**batch.__dict__, "page_size": page, "num_blocks": blocks})


def kv_bytes(layers: int, kv_heads: int, head_dim: int, itemsize: int, tokens: int) -> int:
    """Keys and values of `tokens` tokens in every layer."""
    return layers * 2 * kv_heads * head_dim * itemsize * tokens
