"""Reading a dataset's rows with one Arrow `take` (ftune.datastage.arrow) gives what `datasets` gives row by row,
through every indices mapping the data stage makes (select, shuffle, concatenation), and `write_dataset_dir` makes
Arrow files we wrote a folder `load_from_disk` reads."""

import pytest

datasets = pytest.importorskip("datasets")


def _sets():
    import numpy as np

    base = datasets.Dataset.from_dict({"input_ids": [[i] * (i % 5 + 1) for i in range(50)], "_len": list(range(50))})
    other = datasets.Dataset.from_dict({"input_ids": [[100 + i] for i in range(7)], "_len": [100 + i for i in range(7)]})
    picked = base.select(np.random.default_rng(0).permutation(50)[:30], keep_in_memory=True)
    return {
        "plain": base,
        "selected": base.select([3, 1, 4, 1, 5, 9, 2, 6], keep_in_memory=True),
        "shuffled": base.shuffle(seed=3),
        "concatenated": datasets.concatenate_datasets([picked, other]),
        "reselected": datasets.concatenate_datasets([picked, other]).select(range(5, 30), keep_in_memory=True),
        "empty": base.select([], keep_in_memory=True),
    }


@pytest.mark.parametrize("name", list(_sets()))
def test_rows_equal_datasets_own_reads(name):
    from ftune.datastage.arrow import numpy_columns, rows

    ds = _sets()[name]
    assert rows(ds).to_pylist() == ds.to_list()
    assert rows(ds, ["input_ids"], 2, 6).to_pylist() == [{"input_ids": r} for r in ds[2:6]["input_ids"]]
    assert rows(ds, ["_len"], 5, 10_000).num_rows == max(0, len(ds) - 5)
    assert numpy_columns(ds, ["_len"])["_len"].tolist() == ds["_len"]


def test_write_dataset_dir_reads_back_as_one_dataset(tmp_path):
    import pyarrow as pa

    from ftune.datastage.arrow import write_dataset_dir

    ints = datasets.List(datasets.Value("int32"))
    features = datasets.Features({"input_ids": ints})
    files = []
    for k, part in enumerate([[[1, 2], [3]], [[4, 5, 6]]]):
        table = pa.table({"input_ids": pa.array(part, type=pa.list_(pa.int32()))})
        files.append(f"data-{k:05d}.arrow")
        with pa.OSFile(str(tmp_path / files[-1]), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
    write_dataset_dir(tmp_path, files, features)
    ds = datasets.load_from_disk(str(tmp_path))
    assert ds["input_ids"] == [[1, 2], [3], [4, 5, 6]] and ds.features == features
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data-00000.arrow", "data-00001.arrow", "dataset_info.json",
                                                          "state.json"]


def test_merge_order_is_a_seeded_random_merge_keeping_each_part_in_order():
    """The training order of concatenated (already shuffled) sources: every row once, each source front to back,
    the sources mixed through the whole order (not one after the other), the same for the same seed."""
    import numpy as np

    from ftune.datastage.pipeline import merge_order

    order = merge_order([300, 0, 100], seed=5)
    assert sorted(order.tolist()) == list(range(400)) and order.tolist() == merge_order([300, 0, 100], 5).tolist()
    assert order.tolist() != merge_order([300, 0, 100], 6).tolist()
    first, third = order[order < 300], order[order >= 300]
    assert (np.diff(first) == 1).all() and (np.diff(third) == 1).all()  # each part read front to back
    assert 15 <= (order[:100] >= 300).sum() <= 35  # a quarter of the rows from the third part, in any stretch
    assert merge_order([7], seed=1).tolist() == list(range(7))  # one source: its own (shuffled) order
