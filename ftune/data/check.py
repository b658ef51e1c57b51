"""The pre-launch checks on the data files: does each local source have the fields, format and roles it needs?

Run by the compiler (`ftune plan`, `ftune run`, `--dry-run`) and by `ftune validate --check-paths`, so all of
them refuse the same data. Light on purpose: it reads the first rows with the standard library (pyarrow for
Parquet), never `datasets` or a tokenizer. A file that does not exist is not reported here: the compiler's
input check (`ftune.plan.environment.inputs`) says so, once.
"""

from __future__ import annotations

from pathlib import Path

from ftune.errors import Problem
from ftune.recipe.schema import Recipe
from ftune.recipe.sources import sources
from ftune.data.errors import DataError, field_hint
from ftune.data.formats import DEFAULT_ROLE_MAP, ROLES, required_fields
from ftune.data.sources import peek, resolve

PEEK_ROWS = 5


def check_fields(recipe: Recipe) -> list[Problem]:
    """Every problem found in the first rows of each local source that exists, at its recipe key."""
    problems: list[Problem] = []
    for where, spec in sources(recipe):
        if spec.type != "hub" and not Path(spec.path).expanduser().exists():
            continue  # missing: the input check reports it (or a hub name the loader resolves)
        try:
            src = resolve(spec, where)
            peeked = peek(src, PEEK_ROWS) if src.local else None
        except DataError as err:
            problems.append(Problem.at(f"{where}.path", _strip(err.message, where), err.hint))
            continue
        if peeked is None:
            continue
        columns, rows = peeked
        if not rows and src.kind != "disk":
            problems.append(Problem.at(f"{where}.path", f"{spec.path} has no rows", "check the file"))
            continue
        missing = [(k, c) for k, c in required_fields(src).items() if c not in columns]
        for key, col in missing:
            problems.append(Problem.at(
                f"{where}.fields.{key}",
                f"{spec.format} data needs field `{col}`, but the first rows of {spec.path} have: "
                f"{', '.join(columns) or 'no fields'}",
                field_hint(spec.format, columns),
            ))
        if missing:
            continue
        if spec.format == "chat":
            problems += _check_messages(where, spec, rows)
        if spec.format == "classification" and recipe.model.labels:
            for n, row in enumerate(rows, start=1):
                label = row.get(spec.fields.label)
                if isinstance(label, str) and label not in recipe.model.labels:
                    problems.append(Problem.at(f"{where}.fields.label",
                                     f"row {n} of {spec.path}: label {label!r} is not one of model.labels "
                                     f"({', '.join(recipe.model.labels)})",
                                     "add it to model.labels, or fix the row"))
                    break
    return problems


def _check_messages(where: str, spec, rows: list[dict]) -> list[Problem]:
    f = spec.fields
    mapping = {**DEFAULT_ROLE_MAP, **(spec.roles or {})}
    for n, row in enumerate(rows, start=1):
        messages = row.get(f.messages)
        if not isinstance(messages, list):
            return [Problem.at(f"{where}.fields.messages", f"row {n} of {spec.path}: `{f.messages}` is not a list", None)]
        for m in messages:
            if not isinstance(m, dict) or f.role not in m or f.content not in m:
                keys = ", ".join(m) if isinstance(m, dict) else type(m).__name__
                return [Problem.at(f"{where}.fields.role",
                         f"row {n} of {spec.path}: a message lacks `{f.role}`/`{f.content}` (has: {keys})",
                         "sharegpt data: `fields: {messages: conversations, role: from, content: value}`")]
            if mapping.get(m[f.role]) not in ROLES:
                return [Problem.at(f"{where}.roles", f"row {n} of {spec.path}: unknown role {m[f.role]!r}",
                         f"map it, e.g. `roles: {{{m[f.role]}: assistant}}`")]
    return []


def _strip(message: str, where: str) -> str:
    for prefix in (f"{where}.path: ", f"{where}: "):
        if message.startswith(prefix):
            return message[len(prefix):]
    return message
