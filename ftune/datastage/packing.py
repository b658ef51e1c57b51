"""Packing: first-fit-decreasing into `max_seq_length` rows, and the collators that keep samples apart.

A packed row stores `input_ids`, `labels` and `position_ids` that restart at 0 for each sample; the
first label of every sample is -100 so no token is predicted across a boundary. Attention is kept
inside a sample by the batching the Plan chose (`ftune.plan.batching`):

- `position_ids` (PackedCollator): rows padded to the widest, no attention mask; transformers 5 finds
  the sample boundaries from the position restarts (`masking_utils.find_packed_sequence_indices`).
  It does so only when no KV cache is passed, and Llama-style models create one whenever `use_cache`
  is on (the config default, in train mode too), so the batch carries `use_cache=False`.
- `block_mask` (PackedCollator): an explicit 4D block-diagonal causal mask, for modelling code that may
  not do that (`trust_remote_code`).
- `padding_free` (PaddingFreeCollator): the rows flattened into one row with no pad token, for flash
  attention, which takes `cu_seqlens` from the position restarts.
"""

from __future__ import annotations

from dataclasses import dataclass

from ftune.datafiles.masking import IGNORE


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Bins of item indices: items by decreasing length, each into the first bin with room.

    A segment tree over bins' free space finds the first fitting bin in O(log n), so this is
    O(n log n) for any number of items.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    size = 1
    while size < max(1, len(lengths)):
        size *= 2
    free = [capacity] * (2 * size)  # max free space per subtree; leaves are bins (unopened: capacity)
    bins: list[list[int]] = []
    for i in order:
        need = min(lengths[i], capacity)
        k = 1
        while k < size:  # descend to the leftmost leaf with room
            k <<= 1
            if free[k] < need:
                k += 1
        b = k - size
        if b == len(bins):
            bins.append([i])
        else:
            bins[b].append(i)
        free[k] -= need
        k >>= 1
        while k:  # refresh the maxima above; stop as soon as one is unchanged
            m = free[2 * k] if free[2 * k] >= free[2 * k + 1] else free[2 * k + 1]
            if free[k] == m:
                break
            free[k] = m
            k >>= 1
    return bins


SHARD_TOKENS = 1 << 20
"""Packing reads and bins at most this many tokens at a time (about 40 bytes of working memory each, 40 MiB a
shard): memory stays flat in the number of rows. Samples pack within their shard; each shard ends on a few partly
filled rows (at 100,000 chat rows the fill is 0.9701 with 4M-token shards, 0.9695 with 1M-token ones; the
4M-token shards held about 130 MiB more at the peak: docs/performance.md)."""

FILE_TOKENS = 1 << 25
"""`pack_to_disk` starts a new Arrow file after this many tokens (about 400 MB of int32 columns), as
`save_to_disk` splits at 500 MB."""


def pack(ds, capacity: int):
    """Pack a tokenized dataset (input_ids, labels) into rows of at most `capacity` tokens, in memory.

    Returns (packed dataset with input_ids/labels/position_ids, fill ratio = tokens / (rows x capacity)).
    The gather is done on flat Arrow buffers with numpy, not row by row.
    """
    import datasets

    from ftune.datastage.arrow import rows

    table, tokens = _pack_table(rows(ds, ["input_ids", "labels"]), capacity)
    return datasets.Dataset(table), (tokens / (table.num_rows * capacity) if table.num_rows else 0.0)


def pack_to_disk(ds, capacity: int, folder, lengths, seed: int | None = None,
                 shard_tokens: int = SHARD_TOKENS) -> tuple[int, float]:
    """Pack `ds` (input_ids, labels; `lengths`: its samples' token counts) shard by shard into `folder`, a folder
    `datasets.load_from_disk` reads; returns (packed rows, fill).

    Each shard of about `shard_tokens` tokens is gathered batch by batch (`ftune.datastage.arrow`), packed, its rows
    shuffled when `seed` is given (the samples of a shard are already a random subset when `ds` is shuffled, so the
    rows of the whole set are in random order), and appended to the open Arrow file. Nothing is read back, so memory
    stays flat in the number of rows (a global shuffle of the packed rows read every shard back at random, and its
    pages stayed counted in the process's memory until the end). `ds` in the order `pipeline.merge_order` gives
    reads contiguous stretches of the encoded files."""
    import pickle

    import numpy as np
    import pyarrow as pa

    from ftune.datastage.arrow import rows, write_dataset_dir

    rng = np.random.default_rng(seed) if seed is not None else None
    folder.mkdir(parents=True, exist_ok=True)
    files: list[str] = []
    sink = writer = None
    file_tokens = tokens = packed_rows = 0
    try:
        for a, b in _shards(lengths, shard_tokens):
            # read through a fresh memory map, closed after the shard: the file pages a shard touches would
            # otherwise stay counted in the process's memory until the end (all of them, by the last shard)
            part = pickle.loads(pickle.dumps(ds.select(range(a, b))))
            table, n = _pack_table(rows(part, ["input_ids", "labels"]), capacity)
            del part
            if rng is not None:
                table = table.take(rng.permutation(table.num_rows))
            if writer is None or file_tokens >= FILE_TOKENS:
                if writer is not None:
                    writer.close()
                    sink.close()
                files.append(f"data-{len(files):05d}.arrow")
                sink = pa.OSFile(str(folder / files[-1]), "wb")
                writer, file_tokens = pa.ipc.new_stream(sink, table.schema), 0
            writer.write_table(table)
            tokens, packed_rows, file_tokens = tokens + n, packed_rows + table.num_rows, file_tokens + n
            del table
    finally:
        if writer is not None:
            writer.close()
            sink.close()
    write_dataset_dir(folder, files, _PACKED_FEATURES())
    return packed_rows, (tokens / (packed_rows * capacity) if packed_rows else 0.0)


def _PACKED_FEATURES():  # noqa: N802 - a constant built lazily (datasets is heavy)
    import datasets

    ints = datasets.List(datasets.Value("int32"))
    return datasets.Features({"input_ids": ints, "labels": ints, "position_ids": ints})


def _shards(lengths, shard_tokens: int) -> list[tuple[int, int]]:
    """Contiguous (start, stop) row ranges of at most about `shard_tokens` tokens each (at least one row)."""
    import numpy as np

    ends = np.cumsum(np.asarray(lengths, dtype=np.int64))
    bounds, start = [], 0
    while start < len(ends):
        base = ends[start - 1] if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, base + shard_tokens, side="right")))
        bounds.append((start, stop))
        start = stop
    return bounds or [(0, 0)]


def _pack_table(table, capacity: int):
    """(packed Arrow table, its token count) of one Arrow table of samples."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    ids_col = table.column("input_ids").combine_chunks()
    lab_col = table.column("labels").combine_chunks()
    lengths = pc.list_value_length(ids_col).to_numpy(zero_copy_only=False).astype(np.int64)
    ids = ids_col.flatten().to_numpy(zero_copy_only=False)
    labels = lab_col.flatten().to_numpy(zero_copy_only=False)
    del table, ids_col, lab_col
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)

    bins = first_fit_decreasing(lengths.tolist(), capacity)
    order = np.fromiter((i for b in bins for i in b), dtype=np.int64, count=len(lengths))
    seg_len = lengths[order]
    total = int(seg_len.sum())
    seg_new_start = np.concatenate([[0], np.cumsum(seg_len)[:-1]]).astype(np.int64)
    gather = np.repeat(starts[order] - seg_new_start, seg_len) + np.arange(total, dtype=np.int64)
    new_ids = ids[gather].astype(np.int32)
    new_labels = labels[gather].astype(np.int32)
    new_labels[seg_new_start[seg_len > 0]] = IGNORE  # never predict a sample's first token from the previous one
    positions = (np.arange(total, dtype=np.int64) - np.repeat(seg_new_start, seg_len)).astype(np.int32)
    del gather, ids, labels

    row_tokens = np.fromiter((int(lengths[b].sum()) for b in bins), dtype=np.int64, count=len(bins))
    offsets = pa.array(np.concatenate([[0], np.cumsum(row_tokens)]).astype(np.int32))

    def lists(values):
        return pa.ListArray.from_arrays(offsets, pa.array(values))

    packed = pa.table({"input_ids": lists(new_ids), "labels": lists(new_labels), "position_ids": lists(positions)})
    return packed, total


@dataclass
class PaddingCollator:
    """Pads unpacked causal-LM samples: input_ids with pad, labels with -100, attention_mask 0."""

    pad_token_id: int
    pad_to_multiple_of: int | None = None

    def __call__(self, features: list[dict]) -> dict:
        width = _width(features, self.pad_to_multiple_of)
        return {"input_ids": padded([f["input_ids"] for f in features], width, self.pad_token_id),
                "labels": padded([f["labels"] for f in features], width, IGNORE),
                "attention_mask": padded([[1] * len(f["input_ids"]) for f in features], width, 0)}


@dataclass
class PackedCollator:
    """Stacks packed rows. Padding at a row's end becomes its own segment (positions restart, labels -100).

    `mode="position_ids"` returns no attention_mask (transformers finds the segments from the
    positions); `mode="block_mask"` adds a 4D block-diagonal causal mask: bool for sdpa, additive
    float for eager (which adds the mask to the scores).
    """

    pad_token_id: int
    mode: str = "position_ids"
    attn_implementation: str | None = None
    pad_to_multiple_of: int | None = None

    def __call__(self, features: list[dict]) -> dict:
        import torch

        width = _width(features, self.pad_to_multiple_of)
        ids = padded([f["input_ids"] for f in features], width, self.pad_token_id)
        labels = padded([f["labels"] for f in features], width, IGNORE)
        # the padding at a row's end is a segment of its own: positions restart at 0 there
        pos = torch.tensor([[*f["position_ids"], *range(width - len(f["input_ids"]))] for f in features],
                           dtype=torch.long)
        batch = {"input_ids": ids, "labels": labels, "position_ids": pos}
        if self.mode == "block_mask":
            batch["attention_mask"] = self.block_mask(pos)
        else:
            batch["use_cache"] = False  # with a cache, transformers skips packed-sequence detection
        return batch

    def block_mask(self, pos):
        """[batch, 1, L, L] causal mask that only lets a token see earlier tokens of its own segment."""
        import torch

        seg = (torch.diff(pos, dim=-1, prepend=pos[:, :1] - 1) != 1).cumsum(-1)
        same = seg[:, :, None] == seg[:, None, :]
        causal = torch.ones(pos.shape[1], pos.shape[1], dtype=torch.bool).tril()
        allowed = (same & causal)[:, None]
        if self.attn_implementation == "eager":
            mask = torch.zeros(allowed.shape, dtype=torch.float32)
            return mask.masked_fill(~allowed, torch.finfo(torch.float32).min)
        return allowed


@dataclass
class PaddingFreeCollator:
    """Flattens packed rows into one row [1, tokens]: no pad token, positions restarting per sample.

    transformers' `DataCollatorWithFlattening` semantics on rows that are already packed. The loss is the
    padded batch's: every sample's first label is -100, so the token that ends one row never predicts the
    next row's first, and there are no pad labels to drop.
    """

    def __call__(self, features: list[dict]) -> dict:
        from itertools import chain

        import torch

        def flat(key: str):
            return torch.as_tensor(list(chain.from_iterable(f[key] for f in features)), dtype=torch.long)[None]

        return {"input_ids": flat("input_ids"), "labels": flat("labels"), "position_ids": flat("position_ids"),
                "use_cache": False}  # with a cache, transformers skips packed-sequence detection


@dataclass
class ClassificationCollator:
    """Pads classification samples; labels are one class id per sample."""

    pad_token_id: int

    def __call__(self, features: list[dict]) -> dict:
        import torch

        width = _width(features, None)
        ids = padded([f["input_ids"] for f in features], width, self.pad_token_id)
        mask = padded([[1] * len(f["input_ids"]) for f in features], width, 0)
        labels = torch.tensor([int(f["labels"]) for f in features], dtype=torch.long)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def padded(rows: list, width: int, fill: int):
    """[len(rows), width] int64 tensor of `rows` (lists, tuples or arrays of ints), each right-padded with `fill`.

    One tensor built from padded Python lists: half the CPU of filling a preallocated tensor row by row (a
    tensor per row, then a slice copy), measured on the bench's batches (docs/performance.md)."""
    import torch

    return torch.tensor([[*row, *[fill] * (width - len(row))] for row in rows], dtype=torch.long)


def _width(features: list[dict], multiple: int | None) -> int:
    width = max(len(f["input_ids"]) for f in features)
    if multiple:
        width = -(-width // multiple) * multiple
    return width
