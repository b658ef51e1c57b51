"""How the data stage batches rows, decided by the compiler (the worker's collator carries it out).

- `padding`: unpacked rows right-padded with an attention mask (and every classification or preference batch).
- `position_ids`: packed rows stacked and padded to the widest; no attention mask, transformers finds the
  samples from the position restarts (`masking_utils.find_packed_sequence_indices`) for eager/sdpa.
- `block_mask`: packed rows with an explicit 4D block-diagonal causal mask, for modelling code that may not
  detect packing (`trust_remote_code`). Not possible with flash or flex attention, which take no 4D mask.
- `padding_free`: the micro-batch's packed rows flattened into one row [1, tokens], positions restarting per
  sample, no pad token at all (transformers' `DataCollatorWithFlattening` semantics), for flash-attention,
  whose varlen kernel takes `cu_seqlens` from the position restarts. sdpa/eager keep `position_ids`.
  flex_attention keeps it too: a flattened batch has a new length every step, and the first new length
  recompiles the kernel for dynamic shapes, which torch 2.13's inductor failed to compile on CPU
  (CppCompileError); padded packed rows nearly always keep the width max_seq_length.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from ftune.recipe.objectives import family_of
from ftune.recipe.schema import Recipe

Collator = Literal["padding", "position_ids", "block_mask", "padding_free"]
PADDING_FREE_ATTENTION = ("flash_attention_2",)


def collator(recipe: Recipe) -> Collator:
    """The batching for `recipe`: see the module docstring."""
    if (recipe.model.task == "sequence-classification" or not recipe.data.packing
            or family_of(recipe).rows == "preference"):  # TRL batches preference rows itself
        return "padding"
    if recipe.model.attn_implementation in PADDING_FREE_ATTENTION:
        return "padding_free"
    if recipe.model.trust_remote_code:
        return "block_mask"  # custom modelling code may ignore position-id packing
    return "position_ids"


class DataPlan(BaseModel):
    """What the data stage carries out (`Plan.data`): the compiler decides it, the worker and `ftune data` (which
    compiles a Plan too) read it; neither looks at `data.packing`, `data.cache_dir` or $WORLD_SIZE again."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    collator: Collator
    """How rows are batched (see this module's docstring)."""
    packing: bool
    """Rows are packed into sequences of data.max_seq_length."""
    cache: str
    """The data cache root (absolute): `data.cache_dir`, else $FTUNE_CACHE, else ~/.cache/ftune/data."""
    step_samples: int
    """Samples one optimizer step consumes (the Plan's effective batch size), for the data report."""
    pad_to_multiple_of: int | None = None
    """Batches padded to a multiple of this width: 2 x cp under context parallelism (each row is cut into that
    many load-balanced chunks)."""
    max_images: int | None = None
    """vision-chat: the most images a row may carry (`data.images.max_per_sample`, else the family's limit)."""
    rows: str = "sft"
    """The rows the objective's family trains on (`Family.rows`): `sft` (tokenized, masked, packed by ftune),
    `preference` (pairs TRL tokenizes) or `prompt` (prompts the trainer completes)."""


def cache_root(cache_dir: str | None) -> Path:
    """`data.cache_dir`, else $FTUNE_CACHE, else ~/.cache/ftune/data (as this process sees it, at compile time)."""
    if cache_dir:
        return Path(cache_dir).expanduser().resolve()
    env = os.environ.get("FTUNE_CACHE")
    return Path(env).expanduser().resolve() if env else Path.home() / ".cache" / "ftune" / "data"


def data_plan(recipe: Recipe, step_samples: int) -> DataPlan:
    """The data stage's decisions for `recipe` when one optimizer step consumes `step_samples` samples."""
    packs = bool(recipe.data.packing) and collator(recipe) != "padding"
    layout = recipe.distributed.parallelism
    return DataPlan(collator=collator(recipe), packing=packs, cache=str(cache_root(recipe.data.cache_dir)),
                    step_samples=step_samples, pad_to_multiple_of=2 * layout.cp if layout and layout.cp > 1 else None,
                    max_images=max_images(recipe), rows=family_of(recipe).rows)


def max_images(recipe: Recipe) -> int | None:
    """`data.images.max_per_sample`, else the model family's limit (read from a local config.json), else None."""
    from ftune.models.vision_parts import IMAGE_LIMITS, local_model_type

    if recipe.model.task != "image-text-to-text":
        return None
    if recipe.data.images.max_per_sample is not None:
        return recipe.data.images.max_per_sample
    return IMAGE_LIMITS.get(local_model_type(recipe.model.path))
