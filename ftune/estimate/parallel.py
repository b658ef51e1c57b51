"""Memory per device under N-D parallelism, and the longest sequence that fits (`ftune plan`).

`per_device` (ftune.estimate.memory) counts one rank of the strategy (FSDP's shards over `shard_ranks`);
`split` then divides what tensor and context parallelism divide, as they do:
- weights, gradients, optimizer states and the update's scratch: by tp (each rank holds its slice of every
  split matrix), and by dp_shard where transformers shards the loaded model itself (tp x dp_shard, strategy ddp);
  the all-gathered FSDP units are gathered within a tp slice, so they are divided by tp only;
- activations and backward's temporaries: by tp (each rank computes its heads / MLP slice) and by cp (each rank
  holds 1/cp of every sequence); fixed per-device buffers (cuBLAS workspaces) are not divided.
The counts of replicated small tensors (norms, biases) are divided too: a slight under-count, said in a note.
"""

from __future__ import annotations

from dataclasses import replace

from ftune.estimate.memory import DeviceMemory
from ftune.estimate.facts import MemoryItem

STATE_KINDS = ("weights", "gradients", "optimizer")
GATHERED = "all-gathered FSDP units"


def split(memory: DeviceMemory, *, tp: int = 1, cp: int = 1, load_shard: int = 1) -> DeviceMemory:
    """`memory` of one rank once tp / cp (and transformers' own dp_shard at load, `load_shard`) divide it."""
    if tp == 1 and cp == 1 and load_shard == 1:
        return memory
    items = []
    for item in memory.items:
        if item.kind in STATE_KINDS or item.detail == "optimizer update scratch":
            k = tp if item.detail == GATHERED else tp * load_shard
        elif item.kind == "activations" or (item.kind == "temporary" and item.phase == "backward"):
            k = tp * cp
        else:  # fixed per device whatever the split (cuBLAS workspaces)
            k = 1
        items.append(replace(item, bytes=item.bytes // k))
    return _retotal(memory, items)


def _retotal(memory: DeviceMemory, items: list[MemoryItem]) -> DeviceMemory:
    phase = {ph: sum(i.bytes for i in items if i.phase == ph) for ph in ("always", "backward", "update")}
    peak = "backward" if phase["backward"] >= phase["update"] else "update"
    return replace(memory, items=tuple(items), peak_phase=peak, total=phase["always"] + phase[peak])


def longest_sequence(memory: DeviceMemory, seq: int, device_memory: int, multiple: int = 1,
                     constant: str | None = None) -> int:
    """The longest row (tokens) whose peak fits `device_memory`, from a plan at `seq` tokens: the backward
    phase's activations and temporaries grow linearly with the sequence (SDPA/flash keep no seq x seq scores),
    everything else does not, nor the item whose detail is `constant` (a tiled MLP's slice of hidden-size tokens).
    0 when even the sequence-free part does not fit. Rounded down to `multiple` (2 x cp: context parallelism splits
    a row into that many chunks)."""
    always = sum(i.bytes for i in memory.items if i.phase == "always")
    update = sum(i.bytes for i in memory.items if i.phase == "update")
    scaled = sum(i.bytes for i in memory.items if i.phase == "backward" and i.kind in ("activations", "temporary")
                 and i.detail != constant)
    fixed = sum(i.bytes for i in memory.items if i.phase == "backward") - scaled
    room = device_memory - always - fixed
    if room <= 0 or always + update > device_memory or scaled <= 0:
        return 0
    tokens = room * seq // scaled
    return tokens // multiple * multiple


def split_layout(memory: DeviceMemory, layout) -> DeviceMemory:
    """`split` for a recipe's `distributed.parallelism` (None: unchanged); dp_shard divides at load only with tp."""
    if layout is None:
        return memory
    return split(memory, tp=layout.tp, cp=layout.cp, load_shard=layout.dp_shard if layout.tp > 1 else 1)


def longest_row(memory: DeviceMemory, seq: int, device_memory: int, layout, positions: int | None,
                notes: list[str], constant: str | None = None, cap=None) -> int:
    """`longest_sequence` for the recipe's layout (a multiple of 2 x cp under cp), then `cap(rows)` (the host's RAM),
    then capped at the model's positions with a note saying what memory alone would allow."""
    cp = layout.cp if layout is not None else 1
    longest = longest_sequence(memory, seq, device_memory, 2 * cp if cp > 1 else 1, constant)
    if cap is not None:
        longest = cap(longest)
    if positions and longest > positions:
        notes.append(f"longest row: {longest:,} tokens fit in memory, capped at the model's {positions:,} positions")
        return positions
    return longest
