"""Shared console helpers for commands: rich colours on a terminal, plain text otherwise.

rich is imported only when the stream is a terminal, so piped and CI output stays plain and fast.
"""

from __future__ import annotations

import sys
from typing import TextIO

from ftune.errors import FtuneError, Problem


def _rich_console(stream: TextIO | None):
    if stream is None or stream.closed or not stream.isatty():  # None: the process started with that fd closed
        return None
    from rich.console import Console

    return Console(file=stream, highlight=False, soft_wrap=True)


def print_error(err: FtuneError) -> None:
    """Render a user error on stderr: `file:line:col: error: message` and an indented hint."""
    console = _rich_console(sys.stderr)
    if console is None:
        print(err.render(), file=sys.stderr)
        return
    from rich.markup import escape

    for line in err.render().splitlines():
        styled = escape(line)
        if ": error: " in line:
            where, _, rest = line.partition(": error: ")
            styled = f"[bold]{escape(where)}[/]: [bold red]error[/]: {escape(rest)}"
        elif line.lstrip().startswith("hint:"):
            styled = f"[cyan]{escape(line)}[/]"
        elif line.startswith("error:"):
            styled = f"[bold red]error[/]:{escape(line[6:])}"
        console.print(styled)


def print_problems(problems: list[Problem], stream: TextIO | None = None) -> None:
    """Problems in compiler style, one per entry, with their hints."""
    stream = stream or sys.stdout
    console = _rich_console(stream)
    if console is None:
        for p in problems:
            print(p.render(), file=stream)
        return
    from rich.markup import escape

    for p in problems:
        colour = "red" if p.severity == "error" else "yellow"
        body = f"{p.path}: {p.message}" if p.path else p.message
        console.print(f"[bold]{escape(str(p.location))}[/]: [bold {colour}]{p.severity}[/]: {escape(body)}")
        if p.hint:
            console.print(f"    [cyan]hint: {escape(p.hint)}[/]")


def print_line(text: str, stream: TextIO | None = None, style: str | None = None) -> None:
    """One line of plain output; styled only on a terminal."""
    stream = stream or sys.stdout
    console = _rich_console(stream) if style else None
    if console is None:
        print(text, file=stream)
        return
    from rich.markup import escape

    console.print(f"[{style}]{escape(text)}[/]")


def write_stdout(text: str) -> None:
    """Write a command's result to stdout; a full disk, a closed or failing stdout is a user error (exit 2), and
    stdout is pointed at /dev/null so Python's own flush at exit can't fail a second time."""
    import os

    from ftune.errors import UsageError

    stream = sys.stdout
    try:
        if stream is None or getattr(stream, "ftune_closed", False):
            raise OSError("standard output is closed")
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as err:
        if stream is not None and not getattr(stream, "ftune_closed", False):
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, stream.fileno())
                os.close(devnull)
            except (OSError, ValueError, AttributeError):
                pass
        reason = getattr(err, "strerror", None) or str(err)
        raise UsageError(f"can't write to standard output: {reason}",
                         hint="write to a file with -o FILE, or check the disk the output goes to") from None
