"""Sources: where rows come from. Resolve a recipe's path, load it with `datasets`, peek at it cheaply.

Loading uses `datasets` (JSON/JSONL, CSV, Parquet, text, `save_to_disk` folders, hub names). `peek`
reads the first rows with the standard library only, for `ftune validate --check-paths` and errors.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from ftune import hub
from ftune.errors import Location
from ftune.recipe.schema import DataSource
from ftune.datafiles.errors import DataError, first_bad_csv_record, first_bad_json_line, first_bad_utf8, not_utf8

EXTENSIONS = {
    ".jsonl": "json",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".txt": "text",
    ".text": "text",
}
_DISK_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@dataclass(frozen=True)
class Source:
    """A recipe source with its loader decided and its path made absolute."""

    spec: DataSource
    where: str  # the recipe key, e.g. "data.train[0]"
    path: str  # absolute local path, or the hub name
    kind: str  # json | csv | parquet | text | disk | hub

    @property
    def local(self) -> bool:
        return self.kind != "hub"


def resolve(spec: DataSource, where: str) -> Source:
    """Decide the loader of `spec` and check that a local path exists (relative to the working directory)."""
    path = Path(spec.path).expanduser()
    if spec.type == "hub":
        return Source(spec, where, spec.path, "hub")
    if spec.is_glob:
        files = spec.files()
        if not files:
            raise DataError(f"{where}.path: no file matches {spec.path}",
                            hint=f"data paths are relative to the working directory ({Path.cwd()})")
        kind = spec.type if spec.type != "auto" else EXTENSIONS.get(Path(files[0]).suffix.lower())
        if kind is None or any(EXTENSIONS.get(Path(f).suffix.lower(), kind) != kind for f in files):
            raise DataError(f"{where}.path: {spec.path} matches files of several or unknown types",
                            hint="match files of one type (.jsonl, .csv, .parquet, .txt), or set `type:`")
        return Source(spec, where, str(Path(spec.path).expanduser().absolute()), kind)
    if path.exists():
        path = path.resolve()
        if spec.type != "auto":
            return Source(spec, where, str(path), spec.type)
        if path.is_dir():
            if any((path / m).exists() for m in _DISK_MARKERS):
                return Source(spec, where, str(path), "disk")
            raise DataError(
                f"{where}.path: {spec.path} is a folder but not a `save_to_disk` dataset",
                hint="point `path` at a data file (.jsonl/.json/.csv/.parquet/.txt) or a save_to_disk folder",
            )
        kind = EXTENSIONS.get("".join(path.suffixes[-1:]).lower())
        if kind is None:
            raise DataError(
                f"{where}.path: can't tell the format of {spec.path} from its extension",
                hint=f"set `type:` in the source to one of json, csv, parquet, text (known: {', '.join(EXTENSIONS)})",
            )
        return Source(spec, where, str(path), kind)
    if spec.type == "auto" and not path.suffix and _HUB_NAME.match(spec.path):
        return Source(spec, where, spec.path, "hub")
    raise DataError(
        f"{where}.path: no such file: {spec.path}",
        hint=f"data paths are relative to the working directory ({Path.cwd()}); for a hub dataset set `type: hub`",
        location=Location(file=spec.path),
    )


# ------------------------------------------------------------------------------------------ loading
def load(src: Source, scratch: Path):
    """The source's rows as a `datasets.Dataset` (raw downloads/conversions go under `scratch`)."""
    import datasets

    try:
        split = src.spec.split
        if src.kind == "disk":
            ds = datasets.load_from_disk(src.path)
            splits = dict(ds) if isinstance(ds, datasets.DatasetDict) else {"train": ds}
            if isinstance(ds, datasets.DatasetDict) or is_sliced(split):
                names = split_names(split)
                missing = [n for n in names if n not in splits]
                if missing:
                    raise DataError(
                        f"{src.where}.split: no split {missing[0]!r} in {src.path}",
                        hint=f"available splits: {', '.join(splits)}",
                        location=Location(file=src.path),
                    )
                ds = sliced(splits, split) if is_sliced(split) else splits[split]
        elif src.kind == "hub":
            ds = datasets.load_dataset(src.path, split=split)
        else:
            ds = datasets.load_dataset(
                src.kind, data_files=src.path, split="train", cache_dir=str(scratch / "hf")
            )
            if is_sliced(split):  # a file is one split, `train`; the rules refuse other names with a slice
                ds = sliced({"train": ds}, split)
    except DataError:
        raise
    except Exception as err:  # datasets wraps parser errors; find the line ourselves
        raise _load_error(src, err) from err
    if len(ds) == 0:
        raise _empty(src)
    return ds


def is_sliced(split: str) -> bool:
    """Whether `split` uses `datasets` slice syntax (`train[:20%]`, `train[:100]+validation[:10]`)."""
    return "[" in split or "+" in split


def split_names(split: str) -> list[str]:
    """The split names a (sliced) split reads: `train[:20%]+test` -> ['train', 'test']."""
    return [part.split("[", 1)[0].strip() for part in split.split("+")]


def sliced(splits: dict, spec: str):
    """The rows `spec` selects from loaded splits, as `datasets` reads slice syntax (percent rounding included)."""
    import datasets

    parts = [splits[a.splitname].select(range(a.from_, a.to)) for a in
             datasets.ReadInstruction.from_spec(spec).to_absolute({k: len(v) for k, v in splits.items()})]
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def _empty(src: Source) -> DataError:
    return DataError(
        f"{src.where}: {src.spec.path} has no rows",
        hint="check the file (and `split:` for a folder or hub dataset)",
        location=Location(file=src.path) if src.local else None,
    )


def _load_error(src: Source, err: Exception) -> DataError:
    """Why `datasets` could not load `src`, found in the file itself (each file of a glob, named: the pattern is no
    file to open), else its error as it said it."""
    if src.spec.is_glob:
        for file in src.spec.files():
            found = _file_error(Source(src.spec.model_copy(update={"path": file}), src.where, file, src.kind))
            if found is not None:
                return found
        return DataError(
            f"{src.where}: could not read the files of {src.spec.path} as {src.kind}: {type(err).__name__}: {err}",
            hint="every file of a glob must have the same columns and types; check the files, or give each kind its "
                 "own source")
    found = _file_error(src)
    if found is not None:
        return found
    if src.kind == "hub":
        return DataError(
            f"{src.where}.path: could not load the hub dataset {src.path!r}: {err}",
            hint="check the name, the network (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE) and `split:`",
        )
    return DataError(
        f"{src.where}: could not read {src.spec.path} as {src.kind}: {type(err).__name__}: {err}",
        hint="check the file's contents, or set `type:` in the source",
        location=Location(file=src.path),
    )


def _file_error(src: Source) -> DataError | None:
    """A local file's first bad byte, CSV record or JSON line, or no rows; None when it reads fine."""
    if src.local and src.kind in ("json", "csv", "text") and Path(src.path).is_file():
        bad = first_bad_utf8(src.path)
        if bad is not None:
            return not_utf8(src, *bad)
    if src.kind == "csv" and src.local and Path(src.path).is_file():
        bad_csv = first_bad_csv_record(src.path)
        if bad_csv is not None:
            row, line, msg = bad_csv
            return DataError(
                f"{src.where}: row {row} of {src.spec.path} (starting at line {line}) is not valid CSV: {msg}",
                hint="a quoted cell must end with a closing quote; a quote inside a cell is written twice (\"\")",
                location=Location(file=src.path, line=line),
            )
    if src.kind in ("json", "csv", "text"):
        try:
            peeked = peek(src, 1)
        except DataError as bad:
            return bad
        if peeked is not None and not peeked[1]:
            return _empty(src)
    if src.kind == "json" and src.local and Path(src.path).is_file():
        bad = first_bad_json_line(src.path)
        if bad is not None:
            line, col, msg = bad
            return DataError(
                f"{src.where}: line {line} of {src.spec.path} is not valid JSON: {msg}",
                hint="each line of a .jsonl file must be one JSON object",
                location=Location(file=src.path, line=line, column=col),
            )
    return None


# -------------------------------------------------------------------------------------- fingerprints
def content_hash(src: Source) -> str | None:
    """sha256 of the source's bytes (every file, for a folder); None for hub datasets."""
    if not src.local:
        return None
    h = hashlib.sha256()
    root = Path(src.path)
    if src.spec.is_glob:
        files = [Path(f) for f in src.spec.files()]
    else:
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    for f in files:
        h.update(str(f.relative_to(root) if root.is_dir() else f.name).encode() + b"\0")
        with open(f, "rb") as fh:
            h.update(hashlib.file_digest(fh, "sha256").digest())
    return h.hexdigest()


# ----------------------------------------------------------------------------------- light peeking
def peek(src: Source, n: int = 5) -> tuple[list[str], list[dict]] | None:
    """Column names and the first `n` rows, read without `datasets`; None where that is not possible (hub)."""
    if src.spec.is_glob:  # the first file stands for the others
        src = Source(src.spec, src.where, src.spec.files()[0], src.kind)
    if src.kind == "json":
        return _peek_json(src, n)
    if src.kind == "csv":
        with open(src.path, newline="", encoding="utf-8", errors="replace") as fh:
            reader = csv.DictReader(fh)
            rows = [row for _, row in zip(range(n), reader)]
            return list(reader.fieldnames or []), rows
    if src.kind == "text":
        with open(src.path, encoding="utf-8", errors="replace") as fh:
            rows = [{"text": line.rstrip("\n")} for _, line in zip(range(n), fh)]
        return ["text"], rows
    if src.kind == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(src.path)
        rows = next(pf.iter_batches(batch_size=n), None)
        return list(pf.schema_arrow.names), rows.to_pylist() if rows is not None else []
    if src.kind == "disk":
        return _peek_disk(Path(src.path), split_names(src.spec.split)[0]), []
    return None


def peek_hub(src: Source, n: int = 5) -> tuple[list[str], list[dict]] | None:
    """A hub dataset's columns and first `n` rows of its split, read from the files `datasets` downloaded into the
    Hugging Face cache (`ftune.hub.dataset_snapshot`); None when the cache doesn't hold it (online, the data stage
    reads it after launch) or its files don't say which holds the split."""
    snap = hub.dataset_snapshot(src.path)
    if snap is None:
        return None
    split = split_names(src.spec.split)[0]
    files = sorted(f for f in snap.rglob("*") if f.is_file() and EXTENSIONS.get(f.suffix.lower()) and
                   f.name.lower() != "readme.md")

    def names_split(f: Path) -> bool:  # data/train-00000-of-00001.parquet, train.jsonl, train/part-0.parquet
        parts = f.relative_to(snap).with_suffix("").parts
        return any(re.split(r"[-_.]", p)[0] == split for p in parts)

    chosen = [f for f in files if names_split(f)] or (files if split == "train" and len(files) == 1 else [])
    if not chosen:
        return None
    file = chosen[0]
    return peek(Source(src.spec, src.where, str(file), EXTENSIONS[file.suffix.lower()]), n)


def _peek_json(src: Source, n: int) -> tuple[list[str], list[dict]]:
    rows: list[dict] = []
    with open(src.path, encoding="utf-8", errors="replace") as fh:
        head = fh.read(1 << 16).lstrip()
    if head.startswith("["):  # a JSON array of records
        with open(src.path, encoding="utf-8") as fh:
            try:
                data = json.load(fh)
            except json.JSONDecodeError as err:
                raise DataError(
                    f"{src.where}: {src.spec.path} is not valid JSON: {err.msg}",
                    location=Location(file=src.path, line=err.lineno, column=err.colno),
                ) from err
        rows = [r for r in data[:n] if isinstance(r, dict)]
    else:
        with open(src.path, encoding="utf-8", errors="replace") as fh:
            for lineno, line in enumerate(fh, start=1):
                if len(rows) >= n:
                    break
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise DataError(
                        f"{src.where}: line {lineno} of {src.spec.path} is not valid JSON: {err.msg}",
                        hint="each line of a .jsonl file must be one JSON object",
                        location=Location(file=src.path, line=lineno, column=err.colno),
                    ) from err
                if not isinstance(row, dict):
                    raise DataError(
                        f"{src.where}: line {lineno} of {src.spec.path} is a {type(row).__name__}, not an object",
                        location=Location(file=src.path, line=lineno),
                    )
                rows.append(row)
    columns: list[str] = []
    for r in rows:
        columns += [k for k in r if k not in columns]
    return columns, rows


def _peek_disk(root: Path, split: str) -> list[str]:
    """Column names from a save_to_disk folder's dataset_info.json (of `split` for a DatasetDict)."""
    return list(disk_features(root, split))


def disk_features(root: Path, split: str) -> dict:
    """A save_to_disk folder's features as its dataset_info.json writes them (of `split` for a DatasetDict): column
    -> `{"_type": "Value", "dtype": "string"}`, a list of such (a list of structs: chat messages), ..."""
    if (root / "dataset_dict.json").exists():
        root = root / split
    info = root / "dataset_info.json"
    if not info.exists():
        return {}
    return json.loads(info.read_text()).get("features", {}) or {}
