"""GRPO's tools (`train.rl.tools`): each names a tool that exists (a plugin's too) and its arguments fit, `python`
is refused with why, a name is given once, and the chat template can write tool calls. Refused at `validate`,
located at the key. A `lookup` table file is read by `validate --check-paths` and the compiler
(`table_files`); a row column a tool reads is checked where the data is read (the data stage)."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from pathlib import Path


from ftune.errors import Problem
from ftune.recipe.objectives import family_of
from ftune.recipe.rules import Rule
from ftune.recipe.rules.rl import argument_problems
from ftune.recipe.schema import Recipe

TOOL_TEMPLATES = {"hermes": ("hermes",)}
"""`train.rl.tool_format` -> the built-in chat templates that write its calls (a Jinja string is the user's to
make agree; TRL checks at start that it renders a whole tool-calling conversation)."""


def _with_tools(recipe: Recipe) -> bool:
    """The objective runs a tool loop (grpo; `rl_section` refuses the keys for the others)."""
    from ftune.recipe.objectives import objective

    t = recipe.train
    return family_of(recipe).generates and t.rl is not None and "tools" in objective(t.objective).settings


def _tools(recipe: Recipe):
    return recipe.train.rl.tools if _with_tools(recipe) else []


def tools_known(recipe: Recipe) -> Iterator[Problem]:
    from ftune.tools import REFUSED, available, where

    specs = _tools(recipe)
    if not specs:
        return
    known = available()
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        at = f"train.rl.tools.{i}"
        if spec.name in REFUSED:
            yield Problem.at(f"{at}.name", f"tool '{spec.name}' is refused: {REFUSED[spec.name]}",
                             "use calculator for arithmetic, lookup for facts, regex_extract for a document; or "
                             "install a plugin tool that runs code in a real sandbox")
            continue
        tool = known.get(spec.name)
        if tool is None:
            usable = sorted(n for n, t in known.items() if t is not None)
            close = difflib.get_close_matches(spec.name, usable, n=3, cutoff=0.5)
            yield Problem.at(f"{at}.name", f"no tool named '{spec.name}'",
                             (f"did you mean {', '.join(repr(c) for c in close)}? " if close else "")
                             + f"tools: {', '.join(usable)} (more only through installed plugins)")
            continue
        if spec.name in seen:
            yield Problem.at(f"{at}.name", f"tool '{spec.name}' is named twice; the model calls a tool by its name",
                             "give it once")
        seen.add(spec.name)
        yield from argument_problems("tool", spec.name, tool.args, spec.args, at, "name", where(spec.name))


def tool_settings(recipe: Recipe) -> Iterator[Problem]:
    """The tool loop's settings need tools; the tools need a chat template that writes their calls."""
    rl = recipe.train.rl
    if not _with_tools(recipe):
        return
    if not rl.tools:
        for key in ("max_tool_calls", "tool_error_reward", "tool_format", "tool_timeout"):
            if key in rl.model_fields_set:
                yield Problem.at(f"train.rl.{key}", f"train.rl.{key} sets the tool loop, and train.rl.tools names "
                                 "no tool", "add `tools: [{name: calculator}]` (or lookup, regex_extract), or remove "
                                 "it")
        return
    from ftune.chat import BUILTIN

    template = recipe.data.chat_template
    fits = TOOL_TEMPLATES[rl.tool_format]
    if template in BUILTIN and template not in fits:
        yield Problem.at("data.chat_template", f"the built-in chat template '{template}' can't write tool calls "
                         f"(train.rl.tool_format: {rl.tool_format})",
                         f"use `chat_template: {fits[0]}` (the SFT stage that teaches the calls should use it too)")
    elif template is None:
        yield Problem.at("train.rl.tools", "tools need a chat template that writes tool calls, and "
                         "data.chat_template is unset (the tokenizer's own may not)",
                         f"set `data.chat_template: {fits[0]}` (ChatML with {rl.tool_format} tool calls), the one "
                         "the SFT stage on worked tool calls used")


def table_files(recipe: Recipe) -> list[Problem]:
    """`lookup`'s `path`: the file exists (relative to the working directory) and reads as a table (`validate
    --check-paths` and the compiler: the files tier)."""
    from ftune.tools.builtin import read_table

    found = []
    for i, spec in enumerate(_tools(recipe)):
        path = spec.args.get("path") if spec.name == "lookup" else None
        if not isinstance(path, str):
            continue
        at = f"train.rl.tools.{i}.path"
        if not Path(path).expanduser().is_file():
            found.append(Problem.at(at, f"lookup table not found: {path}",
                                    "paths are relative to the working directory; a table is a .json object, "
                                    ".jsonl of {key, value}, or a .csv/.tsv with key and value columns"))
            continue
        try:
            table = read_table(path)
        except (ValueError, OSError) as err:
            found.append(Problem.at(at, f"lookup table {path} can't be read: {err}"))
            continue
        if not table:
            found.append(Problem.at(at, f"lookup table {path} is empty", "every call would find nothing"))
    return found


RULES: list[Rule] = [tools_known, tool_settings]
