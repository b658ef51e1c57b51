"""Streaming (`data.streaming: true`): rows are read, encoded and packed while training runs, never cached.

Each training source becomes a `datasets.IterableDataset` whose shards are its files (a source's `path` may be a
glob), so several processes split the files between them (accelerate shards a datasets stream by its files when
`dispatch_batches` is off, which the Plan sets). Within a file, rows are encoded by the same encoders as the cached
pipeline (`formats.encoder`) in batches of `BATCH` rows, shuffled within the batch (seeded by the file and the
batch), and, with packing, packed first-fit-decreasing within the batch. Everything is a function of the files and
the seed, so a resumed run, which skips the batches it trained on, sees the same rows as an uninterrupted one.
JSONL files are read line by line here, so a row the encoder refuses and a line that is not JSON are named by file
and line; other file types are read by `datasets`.
"""

from __future__ import annotations

import json
import random

from ftune.errors import Location
from ftune.recipe.schema import Recipe
from ftune.datafiles.errors import DataError
from ftune.datafiles.formats import Context, check_columns, encoder
from ftune.datastage.packing import first_fit_decreasing
from ftune.datafiles.masking import IGNORE
from ftune.datastage.report import DataReport
from ftune.datafiles.sources import Source

BATCH = 1000


class _Locations:
    """`rows[i]` for the encoder: the file and line of the i-th row of the batch being encoded."""

    def __init__(self) -> None:
        self.where: dict[int, Location] = {}

    def __getitem__(self, i: int) -> Location:
        return self.where[i]


def _jsonl_rows(file: str, where: str):
    with open(file, encoding="utf-8", errors="strict") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{where}: line {line_no} of {file} is not valid JSON: {err.msg}",
                                hint="fix or remove the line; a resumed run reads the same line again",
                                location=Location(file=file, line=line_no, column=err.colno)) from None
            if not isinstance(row, dict):
                raise DataError(f"{where}: line {line_no} of {file} is a {type(row).__name__}, not an object",
                                location=Location(file=file, line=line_no))
            yield row, Location(file=file, line=line_no)


def _other_rows(file: str, kind: str):
    import datasets

    for k, row in enumerate(datasets.load_dataset(kind, data_files=file, split="train", streaming=True)):
        yield row, Location(file=file, line=k + 1 if kind in ("csv", "text") else None)


def _samples(files: list[str], src: Source, ctx: Context, seed: int, pack_to: int | None):
    """Generator behind a source's IterableDataset (one shard per file): encoded (and packed) training rows."""
    locations = _Locations()
    encode = encoder(src, ctx, locations)
    for file in files:
        rows = _jsonl_rows(file, src.where) if src.kind == "json" else _other_rows(file, src.kind)
        batch: list[tuple[dict, Location]] = []
        for number, item in enumerate(rows):
            if src.spec.limit and number >= src.spec.limit:
                break
            batch.append(item)
            if len(batch) == BATCH:
                yield from _encode_batch(batch, file, encode, locations, src, seed, pack_to)
                batch = []
        if batch:
            yield from _encode_batch(batch, file, encode, locations, src, seed, pack_to)


def _encode_batch(batch, file, encode, locations, src, seed, pack_to):
    columns = list(dict.fromkeys(k for row, _ in batch for k in row))
    if batch[0][1].line in (None, 1):
        check_columns(src, columns)
    locations.where = {i: loc for i, (_, loc) in enumerate(batch)}
    out = encode({c: [row.get(c) for row, _ in batch] for c in columns}, list(range(len(batch))))
    keep = [i for i, n in enumerate(out["_trainable"]) if n > 0]
    if seed is not None:
        random.Random(f"{seed}:{file}:{batch[0][1].line}").shuffle(keep)
    if not pack_to:
        for i in keep:
            yield {"input_ids": out["input_ids"][i], "labels": out["labels"][i]}
        return
    lengths = [len(out["input_ids"][i]) for i in keep]
    for bin_ in first_fit_decreasing(lengths, pack_to):
        ids, labels, positions = [], [], []
        for j in bin_:
            i = keep[j]
            ids += out["input_ids"][i]
            labels += [IGNORE] + out["labels"][i][1:]  # never predict a sample's first token from the previous one
            positions += range(len(out["input_ids"][i]))
        yield {"input_ids": ids, "labels": labels, "position_ids": positions}


def build_stream(recipe: Recipe, tokenizer, template: str, train_srcs: list[Source], eval_srcs: list[Source],
                 packs: bool):
    """The training IterableDataset, the eval one (None without `data.eval` sources) and their report (no counts:
    nothing is read before training). Eval sources are read in file order, up to their `limit` rows per file (a
    rule requires it), from the start at every evaluation, and packed like the training rows."""
    import datasets

    data, seed = recipe.data, recipe.train.seed
    ctx = Context(tokenizer, data.max_seq_length, data.train_on, template, None, recipe.model.num_labels)
    ints = datasets.List(datasets.Value("int32"))
    cols = {"input_ids": ints, "labels": ints, **({"position_ids": ints} if packs else {})}

    def stream(src: Source, shuffle_seed: int | None):
        return datasets.IterableDataset.from_generator(
            _samples, features=datasets.Features(cols),
            gen_kwargs={"files": src.spec.files(), "src": src, "ctx": ctx, "seed": shuffle_seed,
                        "pack_to": data.max_seq_length if packs else None})

    parts = [stream(src, seed if data.shuffle else None) for src in train_srcs]
    n_files = sum(len(src.spec.files()) for src in train_srcs)
    evals = [stream(src, None) for src in eval_srcs]
    evaluation = None if not evals else evals[0] if len(evals) == 1 else datasets.concatenate_datasets(evals)
    if len(parts) == 1:
        train = parts[0]
    elif data.mix == "interleave":
        weights = [s.spec.weight or 1.0 for s in train_srcs]
        train = datasets.interleave_datasets(parts, probabilities=[w / sum(weights) for w in weights], seed=seed,
                                             stopping_strategy=data.mix_stopping)
    else:
        train = datasets.concatenate_datasets(parts)
    report = DataReport(max_seq_length=data.max_seq_length, packing=packs, streaming=True, stream_files=n_files,
                        stream_eval_files=sum(len(src.spec.files()) for src in eval_srcs),
                        cache_reason="streaming: nothing is cached")
    return train, evaluation, report
