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

from typing import Literal

from ftune.recipe.objectives import preference_data
from ftune.recipe.schema import Recipe

Collator = Literal["padding", "position_ids", "block_mask", "padding_free"]
PADDING_FREE_ATTENTION = ("flash_attention_2",)


def collator(recipe: Recipe) -> Collator:
    """The batching for `recipe`: see the module docstring."""
    if recipe.model.task == "sequence-classification" or not recipe.data.packing or preference_data(recipe):
        return "padding"
    if recipe.model.attn_implementation in PADDING_FREE_ATTENTION:
        return "padding_free"
    if recipe.model.trust_remote_code:
        return "block_mask"  # custom modelling code may ignore position-id packing
    return "position_ids"
