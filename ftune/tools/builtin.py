"""The built-in tools: each `make(args)` returns `call(params, row) -> str` (see `ftune.tools`). Pure Python; they
run in the tool process (`ftune.runtime.tool_pool`), where a call past `train.rl.tool_timeout` is killed."""

from __future__ import annotations

import ast
import csv
import json
import math
import operator
import re
from pathlib import Path


class ToolError(ValueError):
    """A call the tool can't answer (bad input, a bound passed): a tool error, scored tool_error_reward."""


# ------------------------------------------------------------------------------------------ calculator
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def evaluate(expression: str, max_length: int = 200, max_digits: int = 100) -> int | float:
    """The value of an arithmetic expression, read by walking its syntax tree (never eval): numbers, + - * / // %
    ** and parentheses. Bounded: the text's length, and every integer's digits (a power's result is estimated
    before it is computed, so `9**9**9` is refused at once instead of running for minutes)."""
    if len(expression) > max_length:
        raise ToolError(f"the expression is longer than {max_length} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ToolError(f"not an arithmetic expression: {err.msg}") from None

    def digits_ok(value):
        if isinstance(value, int) and value and math.log10(abs(value)) >= max_digits:
            raise ToolError(f"a number has more than {max_digits} digits")
        if isinstance(value, float) and not math.isfinite(value):
            raise ToolError("the result is not finite")
        return value

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return digits_ok(node.value)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](walk(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow):
                if abs(right) > 10_000 or (left not in (0, 1, -1) and
                                           abs(right) * math.log10(max(abs(left), 1e-300)) >= max_digits):
                    raise ToolError(f"the power's result would have more than {max_digits} digits")
            try:
                return digits_ok(_BINARY[type(node.op)](left, right))
            except ZeroDivisionError:
                raise ToolError("division by zero") from None
            except OverflowError:
                raise ToolError("the result is too large") from None
        what = type(node).__name__ if not isinstance(node, ast.Constant) else repr(node.value)
        raise ToolError(f"{what} is not allowed: only numbers, + - * / // % ** and parentheses")

    value = walk(tree)
    if isinstance(value, complex):
        raise ToolError("the result is not a real number")
    return value


def shown(value: int | float) -> str:
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:.12g}"
    return str(value)


def calculator(args):
    return lambda params, row: shown(evaluate(params.expression, args.max_length, args.max_digits))


# ------------------------------------------------------------------------------------------ lookup
def read_table(path: str) -> dict[str, str]:
    """A lookup table file: a JSON object, JSON Lines of {key, value}, or a CSV/TSV with key and value columns."""
    file = Path(path).expanduser()
    text = file.read_text(encoding="utf-8")
    suffix = file.suffix.lower()
    if suffix == ".json":
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"{path} holds a JSON {type(data).__name__}, not an object of key: value")
        return {str(k): _text(v) for k, v in data.items()}
    if suffix in (".jsonl", ".ndjson"):
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        return pairs(rows, path)
    if suffix in (".csv", ".tsv"):
        rows = list(csv.DictReader(text.splitlines(), delimiter="\t" if suffix == ".tsv" else ","))
        return pairs(rows, path)
    raise ValueError(f"{path}: a table is a .json, .jsonl, .csv or .tsv file")


def pairs(rows: list, where: str) -> dict[str, str]:
    out = {}
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or "key" not in r or "value" not in r:
            raise ValueError(f"{where}: entry {i + 1} needs `key` and `value`")
        out[str(r["key"])] = _text(r["value"])
    return out


def row_table(value, column: str) -> dict[str, str]:
    """A row's own table: a JSON object (a struct column: its keys other rows lack read as null and are left
    out), a JSON string of one, or a list of {key, value}."""
    if isinstance(value, str):
        value = json.loads(value)
    if isinstance(value, dict):
        return {str(k): _text(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return pairs(value, f"column `{column}`")
    raise ToolError(f"the row's `{column}` holds {type(value).__name__}, not a table")


def _text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _key(text: str, exact: bool) -> str:
    return text if exact else " ".join(text.split()).casefold()


def lookup(args):
    exact = args.case_sensitive
    fixed = None if args.path is None else {_key(k, exact): v for k, v in read_table(args.path).items()}

    def call(params, row) -> str:
        table = fixed if fixed is not None else {_key(k, exact): v
                                                  for k, v in row_table(row.get(args.column), args.column).items()}
        found = table.get(_key(params.key, exact))
        return found if found is not None else f"no entry for {params.key!r}"

    return call


# ------------------------------------------------------------------------------------------ regex_extract
def regex_extract(args):
    from ftune.patterns import backtracks

    def call(params, row) -> str:
        pattern = params.pattern
        if len(pattern) > args.max_pattern_length:
            raise ToolError(f"the pattern is longer than {args.max_pattern_length} characters")
        try:
            compiled = re.compile(pattern)
        except re.error as err:
            raise ToolError(f"not a regular expression: {err}") from None
        why = backtracks(pattern)
        if why is not None:
            raise ToolError(f"the pattern can backtrack catastrophically ({why})")
        document = row.get(args.column)
        if not isinstance(document, str):
            raise ToolError(f"the row has no document in `{args.column}`")
        found = []
        for m in compiled.finditer(document[: args.max_document_chars]):
            found.append(m.group(1) if compiled.groups else m.group(0))
            if len(found) == args.max_matches:
                break
        return "\n".join(str(f) for f in found) if found else "no match"

    return call
