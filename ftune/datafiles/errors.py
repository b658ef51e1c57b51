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


def first_bad_utf8(path: str | Path) -> tuple[int, int, str] | None:
    """(line, column, byte) of the first byte sequence of the file that is not UTF-8, or None."""
    with open(path, "rb") as fh:
        for lineno, line in enumerate(fh, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as err:
                return lineno, err.start + 1, f"0x{line[err.start]:02x}"
    return None


def not_utf8(src, line: int | None, col: int | None, byte: str) -> DataError:
    """`src`'s data is not UTF-8: the first bad line and column when the file could be scanned."""
    return DataError(
        f"{src.where}: " + (f"line {line} of " if line else "") + f"{src.spec.path} is not valid UTF-8 "
        f"(byte {byte}" + (f" at column {col})" if col else ")"),
        hint="data files must be UTF-8: re-encode it, e.g. `iconv -f latin1 -t utf-8 in > out`",
        location=Location(file=src.path, line=line, column=col) if src.local else None,
    )


def first_bad_csv_record(path: str | Path) -> tuple[int, int, str] | None:
    """(row, line, message) of the first CSV record that does not parse (an unterminated quote runs to the end
    of the file), or None. Row 1 is the first record after the header; line is where the record starts."""
    import csv

    with open(path, encoding="utf-8", errors="replace", newline="") as fh:
        reader = csv.reader(fh, strict=True)
        record = -1
        while True:
            start = reader.line_num + 1
            try:
                next(reader)
            except StopIteration:
                return None
            except csv.Error as err:
                return max(record + 1, 1), start, str(err)
            record += 1


def chat_fields_hint(column: str, message: object = None) -> str:
    """The whole mapping for chat data whose messages are in `column`, from one message's keys: `format: sharegpt`
    when it is ShareGPT's, else `format: chat` with every field named (one round of errors, not three)."""
    keys = message if isinstance(message, dict) else {}
    role = next((k for k in ("role", "from") if k in keys), "role")
    content = next((k for k in ("content", "value", "text") if k in keys), "content")
    if (column, role, content) == ("conversations", "from", "value"):
        return ("this is ShareGPT data: set `format: sharegpt` (= `format: chat` with "
                "`fields: {messages: conversations, role: from, content: value}`)")
    return f"set `format: chat` and `fields: {{messages: {column}, role: {role}, content: {content}}}`"


def first_message(row: dict | None, column: str) -> object:
    messages = (row or {}).get(column)
    return messages[0] if isinstance(messages, list) and messages else None


def field_hint(fmt: str, available: list[str], row: dict | None = None) -> str:
    """A hint for a missing field: the recipe key to set, and a guess when the columns (and the first `row`)
    reveal another format or another chat mapping."""
    cols = set(available)
    if "conversations" in cols or "messages" in cols:
        col = "conversations" if "conversations" in cols else "messages"
        hint = chat_fields_hint(col, first_message(row, col))
        return hint if fmt == "chat" else "this looks like chat data: " + hint.removeprefix("this is ShareGPT data: ")
    if fmt != "instruction" and {"instruction", "output"} <= cols:
        return "this looks like alpaca data: set `format: alpaca` (= `format: instruction`)"
    return f"map the column with `fields:` in the source, e.g. `fields: {{{_field_key(fmt)}: <column>}}`"


def _field_key(fmt: str) -> str:
    return {"chat": "messages", "instruction": "instruction", "pretokenized": "input_ids", "preference": "prompt",
            "unpaired-preference": "prompt"}.get(fmt, "text")
