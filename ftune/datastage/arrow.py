"""A dataset's rows as one Arrow table, gathered inside Arrow: how the data stage reads columns and row ranges.

`datasets` reads a selected or shuffled dataset (one with an indices mapping) row by row: a Python int and a
one-row Arrow slice per row (`Table.fast_gather`). Over a whole column that is about 1 KB of memory a row, held
until the read ends, and it is slow. Arrow's own `Table.take` is no cure either: on a chunked list column (every
memory-mapped `datasets` table) it concatenates all chunks first, the whole column for a few rows. So rows are
gathered batch by batch here: one `take` per record batch that holds wanted rows.
"""

from __future__ import annotations


def rows(ds, columns: list[str] | None = None, start: int = 0, stop: int | None = None):
    """Rows `start:stop` of a `datasets.Dataset` (in its order: selected, shuffled) as a `pyarrow.Table`."""
    n = len(ds)
    stop = n if stop is None else min(stop, n)
    start = min(max(start, 0), stop)
    table = ds.data.table
    if columns is not None:
        table = table.select(columns)
    indices = ds._indices  # datasets has no public accessor; tests/unit/test_data_arrow.py pins the behaviour
    if indices is None:
        return table.slice(start, stop - start)
    return take(table, indices.column(0).slice(start, stop - start).to_numpy())


def take(table, idx):
    """`table.take(idx)` (numpy indices) one record batch at a time, so no chunk is copied but the rows wanted."""
    import numpy as np
    import pyarrow as pa

    if len(idx) == 0:
        return table.slice(0, 0)
    batches = table.to_batches()
    starts = np.cumsum([0] + [b.num_rows for b in batches])
    order = np.argsort(idx, kind="stable")
    wanted = np.asarray(idx, dtype=np.int64)[order]
    which = np.searchsorted(starts, wanted, side="right") - 1
    cuts = np.flatnonzero(np.diff(which)) + 1
    parts = [batches[which[a]].take(pa.array(wanted[a:b] - starts[which[a]]))
             for a, b in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [len(wanted)]]))]
    gathered = pa.Table.from_batches(parts, schema=table.schema).combine_chunks()
    back = np.empty(len(order), dtype=np.int64)
    back[order] = np.arange(len(order))
    return gathered.take(pa.array(back))


def numpy_columns(ds, names: list[str]) -> dict:
    """Flat (integer) columns of a dataset as numpy arrays, in the dataset's order."""
    table = rows(ds, names)
    return {c: table.column(c).to_numpy() for c in names}


def write_dataset_dir(folder, files: list[str], features) -> None:
    """Make `folder`, holding the Arrow stream files `files` that we wrote, a folder `datasets.load_from_disk` reads
    (the layout of `Dataset.save_to_disk`). datasets writes its own two JSON files, for an empty dataset with these
    `features`; only their list of data files is ours."""
    import json
    import tempfile
    from pathlib import Path

    import datasets

    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        datasets.Dataset.from_dict({k: [] for k in features}, features=features).save_to_disk(tmp)
        state = json.loads((Path(tmp) / datasets.config.DATASET_STATE_JSON_FILENAME).read_text())
        state["_data_files"] = [{"filename": f} for f in files]
        (folder / datasets.config.DATASET_STATE_JSON_FILENAME).write_text(json.dumps(state, indent=2, sort_keys=True))
        (Path(tmp) / datasets.config.DATASET_INFO_FILENAME).rename(folder / datasets.config.DATASET_INFO_FILENAME)
