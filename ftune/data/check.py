"""`ftune validate --check-paths`: does each local source exist and have the fields its format reads?

Light on purpose: it reads the first rows with the standard library (pyarrow for Parquet), never
`datasets` or a tokenizer, so `validate` stays fast.
"""

from __future__ import annotations

from ftune.recipe.schema import Recipe
from ftune.worker.data.errors import DataError, field_hint
from ftune.worker.data.formats import DEFAULT_ROLE_MAP, ROLES, required_fields
from ftune.worker.data.sources import peek, resolve

PEEK_ROWS = 5


def check_fields(recipe: Recipe) -> list[tuple[str, str, str | None]]:
    """(path in recipe, message, hint) for every problem found in the first rows of each local source."""
    specs = [(f"data.train[{i}]", s) for i, s in enumerate(recipe.data.train)]
    if isinstance(recipe.data.eval, list):
        specs += [(f"data.eval[{i}]", s) for i, s in enumerate(recipe.data.eval)]
    problems: list[tuple[str, str, str | None]] = []
    for where, spec in specs:
        try:
            src = resolve(spec, where)
            peeked = peek(src, PEEK_ROWS) if src.local else None
        except DataError as err:
            problems.append((f"{where}.path", _strip(err.message, where), err.hint))
            continue
        if peeked is None:
            continue
        columns, rows = peeked
        if not rows and src.kind != "disk":
            problems.append((f"{where}.path", f"{spec.path} has no rows", "check the file"))
            continue
        missing = [(k, c) for k, c in required_fields(src).items() if c not in columns]
        for key, col in missing:
            problems.append((
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
                    problems.append((f"{where}.fields.label",
                                     f"row {n} of {spec.path}: label {label!r} is not one of model.labels "
                                     f"({', '.join(recipe.model.labels)})",
                                     "add it to model.labels, or fix the row"))
                    break
    return problems


def _check_messages(where: str, spec, rows: list[dict]) -> list[tuple[str, str, str | None]]:
    f = spec.fields
    mapping = {**DEFAULT_ROLE_MAP, **(spec.roles or {})}
    for n, row in enumerate(rows, start=1):
        messages = row.get(f.messages)
        if not isinstance(messages, list):
            return [(f"{where}.fields.messages", f"row {n} of {spec.path}: `{f.messages}` is not a list", None)]
        for m in messages:
            if not isinstance(m, dict) or f.role not in m or f.content not in m:
                keys = ", ".join(m) if isinstance(m, dict) else type(m).__name__
                return [(f"{where}.fields.role",
                         f"row {n} of {spec.path}: a message lacks `{f.role}`/`{f.content}` (has: {keys})",
                         "sharegpt data: `fields: {messages: conversations, role: from, content: value}`")]
            if mapping.get(m[f.role]) not in ROLES:
                return [(f"{where}.roles", f"row {n} of {spec.path}: unknown role {m[f.role]!r}",
                         f"map it, e.g. `roles: {{{m[f.role]}: assistant}}`")]
    return []


def _strip(message: str, where: str) -> str:
    for prefix in (f"{where}.path: ", f"{where}: "):
        if message.startswith(prefix):
            return message[len(prefix):]
    return message
