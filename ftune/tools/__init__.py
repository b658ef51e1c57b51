"""Tools as data: `train.rl.tools: [{name, ...args}]` names a tool registered here or by a plugin, which GRPO's
policy may call while it answers (TRL's multi-turn tool loop).

Each tool is a `ToolPlugin`: a pydantic model of its recipe arguments (validated at `ftune validate`, errors located
at the key), a pydantic model of the call's arguments (what the model writes: its fields and their docstrings are
the signature the chat template shows), a one-line description, and the import string of a factory
`make(args) -> call`, where `call(params, row) -> str` answers one call. `row` is the prompt row's columns, so a
tool can read per-row data (the table for `lookup`, the document for `regex_extract`). The calls run in a process
of their own under `train.rl.tool_timeout` (`ftune.runtime.tool_pool`); a call that raises, doesn't fit its
arguments or runs past the limit is a tool error, scored `train.rl.tool_error_reward`.
Light: pydantic only; the tools' code is imported in the worker's tool process.
"""

from __future__ import annotations

from functools import cache

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ftune.plugins import ToolPlugin, installed, merged


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Params(BaseModel):
    """A call's arguments as the model writes them; unknown keys are a tool error."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


# ------------------------------------------------------------------------------------------ calculator
class CalculatorArgs(Args):
    max_length: int = Field(200, ge=1, le=10_000)
    """Longest expression (characters) the calculator reads."""
    max_digits: int = Field(100, ge=1, le=10_000)
    """Largest number of digits an integer may have, in the expression, on the way, and in the result."""


class CalculatorCall(Params):
    expression: str
    """An arithmetic expression: numbers, + - * / ** % // and parentheses, e.g. (3 + 4) * 2."""


# ------------------------------------------------------------------------------------------ lookup
class LookupArgs(Args):
    path: str | None = None
    """A local file holding the table (relative to the working directory): a JSON object {key: value}, JSON Lines of
    {"key": ..., "value": ...}, or a CSV/TSV with columns key and value."""
    column: str | None = None
    """The prompt rows' column holding each row's own table (a JSON object, or a list of {key, value})."""
    case_sensitive: bool = False
    """Match keys exactly; by default keys match ignoring case and surrounding spaces."""

    @model_validator(mode="after")
    def _one_source(self) -> LookupArgs:
        if (self.path is None) == (self.column is None):
            raise ValueError("set exactly one of `path` (a table file) and `column` (each row's own table)")
        return self


class LookupCall(Params):
    key: str
    """The key to look up."""


# ------------------------------------------------------------------------------------------ regex_extract
class RegexExtractArgs(Args):
    column: str = "document"
    """The prompt rows' column holding the document the patterns search."""
    max_matches: int = Field(5, ge=1, le=1000)
    """Matches returned at most (one a line)."""
    max_document_chars: int = Field(20_000, ge=1)
    """Only this many characters of the document are searched (bounded work per call)."""
    max_pattern_length: int = Field(200, ge=1)
    """Longest pattern (characters) a call may give."""


class RegexExtractCall(Params):
    pattern: str
    """A Python regular expression; the matches (its first group, where it has one) are returned."""


# ------------------------------------------------------------------------------------------ python
class PythonArgs(Args):
    model_config = ConfigDict(extra="allow")


_B = "ftune.tools.builtin"
BUILTIN: dict[str, ToolPlugin] = {
    "calculator": ToolPlugin(f"{_B}:calculator", CalculatorCall, "Evaluate an arithmetic expression and return "
                             "the result.", CalculatorArgs),
    "lookup": ToolPlugin(f"{_B}:lookup", LookupCall, "Look a key up in the table and return its value.",
                         LookupArgs),
    "regex_extract": ToolPlugin(f"{_B}:regex_extract", RegexExtractCall, "Search the document with a regular "
                                "expression and return the matches, one a line.", RegexExtractArgs),
}
REFUSED: dict[str, str] = {
    "python": "ftune runs no model-written code: a `python` tool needs a real sandbox (a separate machine or a "
              "locked-down container with no network, no files and limits on time and memory), and ftune has none "
              "to offer here; a process of its own with a time limit is not one",
}
"""Names ftune knows and refuses, with why (a plugin that brings a real sandbox can register another name)."""


@cache
def available() -> dict[str, ToolPlugin]:
    """The built-in tools and the installed plugins'; a plugin may not take a built-in's name (`merged`)."""
    return merged("tools", {**BUILTIN, **{name: None for name in REFUSED}})


def where(name: str) -> str:
    """Who provides a tool, for messages."""
    return "ftune" if name in BUILTIN else installed().versions.get(name, "a plugin")


def row_columns(name: str, args: BaseModel | None) -> list[str]:
    """The prompt rows' columns a tool reads (its per-row data), from its validated arguments."""
    if args is None or name not in BUILTIN:
        return []
    column = getattr(args, "column", None)
    return [column] if column else []


def signature(name: str, plugin: ToolPlugin) -> dict:
    """The tool's JSON schema as chat templates take it (`tools=[...]`): name, description, parameters."""
    schema = plugin.params.model_json_schema()
    props = {k: {key: v[key] for key in ("type", "description", "enum") if key in v}
             for k, v in schema.get("properties", {}).items()}
    return {"type": "function", "function": {
        "name": name, "description": plugin.description,
        "parameters": {"type": "object", "properties": props, "required": list(schema.get("required", []))}}}
