"""Data errors: an `FtuneError` that names the file, the row (and line), and survives worker processes.

`datasets.map(num_proc=N)` re-raises a worker's exception in the parent, which needs it to pickle;
`FtuneError`'s keyword-only constructor does not, so `DataError` says how to rebuild itself.
"""

from __future__ import annotations

import json
from pathlib import Path

from ftune.errors import FtuneError, Location


class DataError(FtuneError):
    """A problem in a data file or in how the recipe reads it."""

    def __reduce__(self):
        return (DataError, (self.message, self.hint, self.location))


def json_line_of_row(path: str | Path, row: int) -> int | None:
    """1-based line of the `row`-th (0-based) record of a JSONL file, skipping blank lines as loaders do."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            seen = -1
            for lineno, line in enumerate(fh, start=1):
                if line.strip():
                    seen += 1
                    if seen == row:
                        return lineno
    except OSError:
        return None
    return None


def row_location(path: str, kind: str, row: int) -> Location:
    """Where row `row` (0-based) of a source is: a line for JSONL/text/CSV files, else just the file."""
    if kind == "json" and str(path).endswith(".jsonl"):
        return Location(file=str(path), line=json_line_of_row(path, row))
    if kind == "text":
        return Location(file=str(path), line=json_line_of_row(path, row))
    if kind == "csv":
        return Location(file=str(path), line=row + 2)  # after the header; multi-line quoted cells shift it
    return Location(file=str(path))


def first_bad_json_line(path: str | Path) -> tuple[int, int, str] | None:
    """(line, column, message) of the first line of a JSONL file that does not parse, or None."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                json.loads(line)
            except json.JSONDecodeError as err:
                return lineno, err.colno, err.msg
    return None


def field_hint(fmt: str, available: list[str]) -> str:
    """A hint for a missing field: the recipe key to set, and a guess when the columns reveal another format."""
    cols = set(available)
    if fmt != "chat" and ("conversations" in cols or "messages" in cols):
        col = "conversations" if "conversations" in cols else "messages"
        extra = ", role: from, content: value" if col == "conversations" else ""
        return f"this looks like chat data: set `format: chat` and `fields: {{messages: {col}{extra}}}`"
    if fmt != "instruction" and {"instruction", "output"} <= cols:
        return "this looks like alpaca data: set `format: instruction`"
    return f"map the column with `fields:` in the source, e.g. `fields: {{{_field_key(fmt)}: <column>}}`"


def _field_key(fmt: str) -> str:
    return {"chat": "messages", "instruction": "instruction", "pretokenized": "input_ids", "preference": "prompt",
            "unpaired-preference": "prompt"}.get(fmt, "text")
