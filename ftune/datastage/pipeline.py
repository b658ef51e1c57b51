"""Preprocessing: load → encode (format + masking) → drop → split → mix → shuffle → pack → save.

Runs once per cache key, inside a scratch folder that becomes the cache entry. Every random choice
is seeded by `train.seed`, so the same recipe and files always give the same rows.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ftune.recipe.schema import EvalSplit, Recipe
from ftune.datastage import packing
from ftune.datastage.arrow import numpy_columns
from ftune.datafiles.errors import DataError, row_location
from ftune.datafiles.formats import (
    ANOMALIES,
    Context,
    check_columns,
    check_template,
    count_anomalies,
    encoder,
    required_fields,
)
from ftune.datastage.report import DataReport, SourceReport, length_stats
from ftune.datafiles.sources import Source, load
from ftune.generation.stops import count_unstopped, stop_ids

BOOKKEEPING = ["_len", "_trainable", "_anomalies"]
SOURCE_ROW = "_source_row"
"""An encoder's column: the row of its source each encoded row came from (0-based); `assemble` folds it into
ORIGIN with the source's index."""
ORIGIN = "_origin"
ORIGINS_FILE = "origins.npz"
"""A cache entry's file: per split, each sample's source (its index in the report's sources) and row, as
`source << 40 | row`; `ftune data` names the file and row a sample came from. Packed entries have none."""


def features(task: str):
    import datasets

    ints = datasets.List(datasets.Value("int32"))
    cols = {"input_ids": ints, "labels": ints}
    if task == "sequence-classification":
        cols = {"input_ids": ints, "attention_mask": datasets.List(datasets.Value("int8")),
                "labels": datasets.Value("int64")}
    return datasets.Features({**cols, "_len": datasets.Value("int32"), "_trainable": datasets.Value("int32"),
                              "_anomalies": datasets.Value("int8")})


def infer_label_names(recipe: Recipe, loaded: list[tuple[Source, object]]) -> list[str] | None:
    """`model.labels`, else the sorted string labels found in the training sources, else None (integer ids)."""
    if recipe.model.labels:
        return list(recipe.model.labels)
    values: set = set()
    for src, ds in loaded:
        values |= set(ds.unique(src.spec.fields.label))
    if values and all(isinstance(v, str) for v in values):
        return sorted(values)
    return None


def map_source(ds, fn, src: Source, recipe: Recipe, scratch: Path, seed: int, what: str, **kwargs):
    """`ds.map(fn, with_indices=True)` for one source: its own cache file in `scratch`, `data.num_proc` processes and
    a fingerprint from the source and the seed (else datasets pickles the tokenizer to hash the function)."""
    tag = src.where.replace("data.", "").replace("[", "-").replace("]", "")
    return ds.map(fn, with_indices=True, num_proc=recipe.data.num_proc,
                  cache_file_name=str(scratch / f"enc-{tag}.arrow"), load_from_cache_file=False,
                  new_fingerprint=f"ftune-{tag}-{seed}", desc=f"ftune: {src.where} ({what})", **kwargs)


def truncation_report(src: Source, enc) -> SourceReport:
    """The report of a source TRL tokenizes itself: every row kept, those cut counted from `_truncated`."""
    truncated = int(numpy_columns(enc, ["_truncated"])["_truncated"].sum())
    return SourceReport(src.where, src.spec.path, src.spec.format, len(enc), len(enc), 0, truncated)


def encode_source(src: Source, ds, ctx: Context, recipe: Recipe, scratch: Path, seed: int):
    """Encode one source; returns (dataset with bookkeeping columns, its SourceReport)."""
    import numpy as np

    check_columns(src, ds.column_names, ds[0] if len(ds) else None)
    check_template(src)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(ds)) if recipe.data.shuffle else np.arange(len(ds))
    if src.spec.limit:
        order = order[: src.spec.limit]
    if not (len(order) == len(ds) and (order == np.arange(len(ds))).all()):
        ds = ds.select(order, keep_in_memory=True)
    enc = map_source(ds, encoder(src, ctx, order), src, recipe, scratch, seed, src.spec.format, batched=True,
                     remove_columns=ds.column_names, features=features(recipe.model.task))
    enc = enc.add_column(SOURCE_ROW, order.astype(np.int64))
    cols = numpy_columns(enc, BOOKKEEPING)
    keep = cols["_trainable"] > 0
    truncated = int((cols["_len"] > ctx.max_len).sum()) if ctx.max_len else 0
    report = SourceReport(src.where, src.spec.path, src.spec.format, len(enc), int(keep.sum()),
                          int((~keep).sum()), truncated)
    _check_dropped(src, report, np.flatnonzero(~keep), order, recipe.data.max_dropped_fraction)
    if src.spec.format == "chat":
        counts, report.first_anomaly = count_anomalies(cols["_anomalies"], order)
        report.assistant_first, report.user_twice, report.empty_content = (counts[k] for k in ANOMALIES)
    if report.dropped:
        enc = enc.select(np.flatnonzero(keep), keep_in_memory=True)
    if src.spec.format in ("chat", "instruction") and ctx.train_on == "completion" and recipe.model.task == "causal-lm":
        found = stop_ids(ctx.tokenizer)
        report.stops = sorted(found.values())
        report.turns, report.unstopped = count_unstopped(enc, found, ctx.max_len)
    return enc, report


def _check_dropped(src: Source, rep: SourceReport, dropped_idx, order, limit: float) -> None:
    if rep.rows == 0 or rep.dropped / rep.rows <= limit:
        return
    first = int(order[dropped_idx[0]])
    loc = row_location(src.path, src.kind, first) if src.local else None
    where = f" (e.g. row {first + 1}{f', line {loc.line}' if loc and loc.line else ''})"
    fields = ", ".join(f"`{c}`" for c in required_fields(src).values())
    raise DataError(
        f"{src.where}: {rep.dropped} of {rep.rows} samples ({rep.dropped / rep.rows:.0%}) have no trainable token "
        f"after masking and truncation{where}; the limit is data.max_dropped_fraction = {limit}",
        hint=f"check that the response field exists and is not empty ({fields}), that data.max_seq_length "
        "leaves room after the prompt, and data.train_on",
        location=loc,
    )


def split_eval(enc, fraction: float, seed: int):
    """Hold out `fraction` of a source's samples (seeded), keeping the order of both parts."""
    import numpy as np

    n = len(enc)
    k = min(n - 1, max(1, round(fraction * n))) if n > 1 else 0
    held = np.sort(np.random.default_rng(seed).permutation(n)[:k])
    rest = np.setdiff1d(np.arange(n), held)
    return enc.select(rest, keep_in_memory=True), enc.select(held, keep_in_memory=True)


def mix(parts: list, weights: list[float | None], seed: int, how: str = "concat",
        stopping: str = "first_exhausted"):
    """Combine encoded sources; returns (dataset, samples taken from each source).

    concat: concatenated; with weights, each resampled to weight/Σweights of the total (repeating rows).
    interleave: `datasets.interleave_datasets` with probabilities weight/Σweights (equal without weights)."""
    import datasets
    import numpy as np

    if how == "interleave":
        w = np.array([1.0 if x is None else x for x in weights])
        tagged = [p.add_column("_source", np.full(len(p), i, dtype=np.int16)) for i, p in enumerate(parts)]
        mixed = datasets.interleave_datasets(tagged, probabilities=(w / w.sum()).tolist(), seed=seed,
                                             stopping_strategy=stopping)
        counts = np.bincount(numpy_columns(mixed, ["_source"])["_source"],
                             minlength=len(parts))
        return mixed.remove_columns(["_source"]), [int(c) for c in counts]
    if all(w is None for w in weights):
        return datasets.concatenate_datasets(parts), [len(p) for p in parts]
    w = np.array([1.0 if x is None else x for x in weights])
    total = sum(len(p) for p in parts)
    rng = np.random.default_rng(seed)
    out, counts = [], []
    for part, wi in zip(parts, w):
        n, target = len(part), int(round(total * wi / w.sum()))
        counts.append(target if n else 0)
        if n == 0 or target == 0:
            continue
        idx = np.concatenate([np.tile(np.arange(n), target // n), np.sort(rng.permutation(n)[: target % n])])
        out.append(part.select(idx, keep_in_memory=True))
    return datasets.concatenate_datasets(out), counts


def merge_order(sizes: list[int], seed: int):
    """A seeded random merge of concatenated parts of `sizes` rows, each kept in its own order: the indices into the
    concatenation. Each part is already shuffled (every source is encoded in a seeded random order), so the merge is
    a uniformly random order of all rows, as a permutation would be; but a range of it reads each part front to
    back, so packing's shards read contiguous stretches of the encoded files, not pages all over them."""
    import numpy as np

    labels = np.repeat(np.arange(len(sizes)), sizes)
    np.random.default_rng(seed).shuffle(labels)
    order = np.empty(len(labels), dtype=np.int64)
    start = 0
    for part, size in enumerate(sizes):
        order[labels == part] = np.arange(start, start + size)
        start += size
    return order


def assemble(recipe: Recipe, train: list, eval_srcs: list[Source], encode, report: DataReport):
    """Encoded sources -> the train and eval datasets: eval split held out per source, sources mixed by weight,
    shuffled (seeded). `train` holds (source, loaded dataset) pairs; `encode(src, ds, seed) -> (enc, SourceReport)`.
    Shared by the SFT formats (`preprocess`) and the preference formats."""
    import datasets
    import numpy as np

    data, seed = recipe.data, recipe.train.seed
    train_parts, eval_parts = [], []
    for i, (src, ds) in enumerate(train):
        enc, rep = encode(src, ds, seed + i)
        enc = with_origin(enc, len(report.sources))
        if isinstance(data.eval, EvalSplit):
            enc, held = split_eval(enc, data.eval.split, seed + 1000 + i)
            eval_parts.append(held)
        report.sources.append(rep)
        train_parts.append(enc)
    for i, src in enumerate(eval_srcs):
        enc, rep = encode(src, None, seed + 2000 + i)
        enc = with_origin(enc, len(report.sources))
        report.sources.append(rep)
        eval_parts.append(enc)
    mixed, taken = mix(train_parts, [s.spec.weight for s, _ in train], seed, data.mix, data.mix_stopping)
    for rep, used in zip(report.sources, taken + [len(p) for p in eval_parts]):
        rep.used = used
    if data.shuffle and data.mix != "interleave":  # interleaving already draws the (shuffled) sources at random
        order = merge_order([c for c in taken if c] if any(s.spec.weight is not None for s, _ in train)
                            else [len(p) for p in train_parts], seed)
        if not (order == np.arange(len(order))).all():
            mixed = mixed.select(order, keep_in_memory=True)
    if len(mixed) == 0:
        raise DataError("data.train: no training samples left", hint="check the sources and data.eval.split")
    if isinstance(data.eval, EvalSplit) and not any(len(p) for p in eval_parts):
        # a source of one row keeps it for training: an empty eval set would fail the first evaluation
        rows = sum(len(p) for p in train_parts)
        raise DataError(f"data.eval.split: {data.eval.split} of {rows} training row{'s' if rows != 1 else ''} holds "
                        "out no row for evaluation (a source keeps at least one row for training)",
                        hint="add rows, give data.eval its own sources (`data.eval: [{path: ...}]`), or remove "
                        "data.eval")
    return mixed, datasets.concatenate_datasets(eval_parts) if eval_parts else None


def with_origin(enc, source: int):
    """The encoded rows of source number `source` with their ORIGIN (the encoder's SOURCE_ROW folded in)."""
    import numpy as np

    if SOURCE_ROW not in enc.column_names:
        return enc
    rows = numpy_columns(enc, [SOURCE_ROW])[SOURCE_ROW].astype(np.int64)
    return enc.remove_columns([SOURCE_ROW]).add_column(ORIGIN, (np.int64(source) << 40) | rows)


def split_origins(scratch: Path, train, evals, write: bool = True):
    """(train, evals) without their ORIGIN column, which goes to the entry's ORIGINS_FILE (unless not `write`)."""
    import numpy as np

    kept, found = [], {}
    for name, ds in (("train", train), ("eval", evals)):
        if ds is not None and ORIGIN in ds.column_names:
            found[name] = numpy_columns(ds, [ORIGIN])[ORIGIN]
            ds = ds.remove_columns([ORIGIN])
        kept.append(ds)
    if found and write:
        np.savez(scratch / ORIGINS_FILE, **found)
    return kept[0], kept[1]


def origins(entry: Path, split: str) -> list[tuple[int, int]] | None:
    """Each sample's (source index in the report's sources, 0-based row) for `split` of a cache entry; None when the
    entry holds none (packed rows, streamed data, a format whose rows come from elsewhere)."""
    import numpy as np

    path = Path(entry) / ORIGINS_FILE
    if not path.is_file():
        return None
    with np.load(path) as found:
        if split not in found:
            return None
        return [(int(o >> 40), int(o & ((1 << 40) - 1))) for o in found[split]]


def preprocess(recipe: Recipe, tokenizer, train_srcs: list[Source], eval_srcs: list[Source],
               template: str, scratch: Path, packs: bool, log=None) -> tuple[DataReport, list[str] | None]:
    """Build the datasets into `scratch/train` (and `scratch/eval`) and return the report; `packs` is the Plan's
    packing decision (`DataPlan.packing`). `log`: a plain line as each source starts and ends encoding (progress
    that a log file or a pipe shows too)."""
    import time

    import numpy as np

    data, seed = recipe.data, recipe.train.seed
    loaded = [(s, load(s, scratch)) for s in train_srcs]
    names = infer_label_names(recipe, loaded) if recipe.model.task == "sequence-classification" else None
    ctx = Context(tokenizer, data.max_seq_length, data.train_on, template, names, recipe.model.num_labels)
    report = DataReport(max_seq_length=data.max_seq_length, packing=packs, label_names=names)

    def encode(src, ds, s):
        ds = ds if ds is not None else load(src, scratch)
        t0 = time.time()
        if log is not None:
            log(f"data: encoding {src.where} ({src.spec.format}, {len(ds):,} rows) ...")
        enc, rep = encode_source(src, ds, ctx, recipe, scratch, s)
        if log is not None:
            log(f"data: encoded {src.where}: {rep.samples:,} samples in {time.time() - t0:.1f}s")
        return enc, rep

    train, evals = assemble(recipe, loaded, eval_srcs, report=report, encode=encode)

    cols = numpy_columns(train, BOOKKEEPING)  # only these columns are gathered
    lengths = np.minimum(cols["_len"], data.max_seq_length) if data.max_seq_length else cols["_len"]
    report.train_samples, report.eval_samples = len(train), len(evals) if evals is not None else 0
    report.tokens, report.trainable_tokens = int(lengths.sum()), int(cols["_trainable"].sum())
    for k, v in length_stats(cols["_len"]).items():
        setattr(report, k, v)
    train = train.remove_columns(BOOKKEEPING)
    train, evals = split_origins(scratch, train, evals, write=not packs)  # a packed row holds several samples

    if packs:  # packed straight into the entry's folders, shard by shard
        report.packed_rows, report.fill = packing.pack_to_disk(train, data.max_seq_length, scratch / "train", lengths,
                                                               seed if data.shuffle else None)
        if evals is not None:
            eval_lengths = numpy_columns(evals, ["_len"])["_len"]
            report.eval_packed_rows, _ = packing.pack_to_disk(evals, data.max_seq_length, scratch / "eval",
                                                              np.minimum(eval_lengths, data.max_seq_length))
    else:
        train.save_to_disk(str(scratch / "train"))
        if evals is not None:
            evals.remove_columns(BOOKKEEPING).save_to_disk(str(scratch / "eval"))
    finish_entry(scratch, report)
    return report, names


def preprocess_text_rows(recipe: Recipe, train_srcs: list[Source], eval_srcs: list[Source], scratch: Path, encode,
                         bookkeeping: list[str]) -> DataReport:
    """The formats TRL tokenizes itself (preference, prompt): rows encoded by `encode(src, ds, seed)` (text columns
    plus `bookkeeping`: `_len`, `_truncated`, and `_trainable` where the format knows it), assembled like the SFT
    sources, saved into `scratch/train` (and `scratch/eval`) with their report."""
    report = DataReport(max_seq_length=recipe.data.max_seq_length)
    train, evals = assemble(recipe, [(s, None) for s in train_srcs], eval_srcs, report=report,
                            encode=lambda src, ds, seed: encode(src, load(src, scratch), seed))
    cols = numpy_columns(train, [c for c in ("_len", "_trainable") if c in bookkeeping])
    lengths = cols["_len"]
    report.train_samples, report.eval_samples = len(train), len(evals) if evals is not None else 0
    # a prompt's completions are generated in training: nothing of it is trained
    trained = int(cols["_trainable"].sum()) if "_trainable" in cols else 0
    report.tokens, report.trainable_tokens = int(lengths.sum()), trained
    for k, v in length_stats(lengths).items():
        setattr(report, k, v)
    train, evals = split_origins(scratch, train, evals)
    train.remove_columns(bookkeeping).save_to_disk(str(scratch / "train"))
    if evals is not None:
        evals.remove_columns(bookkeeping).save_to_disk(str(scratch / "eval"))
    finish_entry(scratch, report)
    return report


def finish_entry(scratch: Path, report: DataReport) -> None:
    """The entry's report.json written, and the encoding's scratch files (datasets' caches, encoded sources) removed:
    what is left in `scratch` is the cache entry."""
    (scratch / "report.json").write_text(json.dumps(report.as_dict(), indent=1))
    for tmp in [scratch / "hf", *scratch.glob("enc-*.arrow"), *scratch.glob("tmp*")]:
        shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
