"""User-facing errors: a message, a hint, and where the problem is.

Every error a user can cause by what they wrote (a recipe, an override, a data file) is an
`FtuneError`. The CLI renders it without a traceback (unless `--debug`) and maps it to an exit code.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Literal

# Documented exit codes (README "Exit codes").
EXIT_OK = 0
EXIT_INVALID = 1  # a recipe (or its data / model) is invalid
EXIT_USAGE = 2  # bad command-line usage or an I/O problem
EXIT_RUNTIME = 3  # the run itself failed (training crashed, a save check failed)
EXIT_NONFINITE = 4  # training stopped on a non-finite loss or gradient norm (nothing non-finite was saved)
EXIT_BUSY = 5  # the run dir is in use by another live ftune process (its lock is held)
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT): complete checkpoints are kept
EXIT_TERMINATED = 143  # SIGTERM (preemption): a checkpoint of the current step was saved; rerun to resume



def key(path: Iterable[str | int]) -> str:
    """The one spelling of a recipe key, as the recipe writes it: ("data", "train", 0, "path") ->
    `data.train[0].path`. Every `Problem.path` is spelled so."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def key_path(text: str) -> tuple[str | int, ...]:
    """`data.train[0].path` (or the dotted `data.train.0.path` an override writes) -> ("data", "train", 0, "path")."""
    parts = re.sub(r"\[(\d+)\]", r".\1", text).split(".") if text else []
    return tuple(int(p) if p.isascii() and p.isdigit() else p for p in parts)


@dataclass(frozen=True)
class Location:
    """Where a problem is: a file position, an override on the command line, or a default."""

    file: str | None = None
    line: int | None = None  # 1-based
    column: int | None = None  # 1-based
    origin: str | None = None  # "override", "default", "env", ... when there is no file position

    def __str__(self) -> str:
        if self.file is None:
            return f"<{self.origin}>" if self.origin else "<recipe>"
        if self.line is None:
            return self.file
        return f"{self.file}:{self.line}:{self.column or 1}"


@dataclass(frozen=True)
class Problem:
    """One located problem in a recipe: `file:line:col: error: path: message` plus a hint."""

    message: str
    path: str = ""  # dotted key path as the user wrote it, e.g. "peft.r"
    hint: str | None = None
    location: Location = field(default_factory=Location)
    severity: str = "error"  # error | warning
    anchor: Literal["key", "value", "parent"] = "key"
    """Where the location points while the recipe loads: the key (a rule's problem, an unknown key), its value (a
    bad value), or the mapping holding it (a missing key)."""

    @classmethod
    def at(cls, path: str | Iterable[str | int], message: str, hint: str | None = None,
           anchor: Literal["key", "value", "parent"] = "key") -> Problem:
        """A problem at a recipe key, not located yet: every check (the loader's schema, interpolation and secret
        checks, recipe rules, environment, model preflight) returns these. `path` is a key, or its parts, spelled
        the one way (`data.train.0.path` becomes `data.train[0].path`). The loader locates its own;
        `LoadedRecipe.error` the rest."""
        return cls(message=message, path=key(key_path(path) if isinstance(path, str) else path), hint=hint,
                   anchor=anchor)

    def render(self) -> str:
        head = f"{self.location}: {self.severity}: "
        body = f"{self.path}: {self.message}" if self.path else self.message
        text = head + body
        if self.hint:
            text += f"\n    hint: {self.hint}"
        return text

    def as_json(self) -> dict:
        loc = asdict(self.location)
        return {
            "file": loc["file"],
            "line": loc["line"],
            "column": loc["column"],
            "path": self.path,
            "message": self.message,
            "hint": self.hint,
            "severity": self.severity,
        }


class FtuneError(Exception):
    """An error the user can fix. Rendered as message + hint, never as a traceback."""

    exit_code = EXIT_INVALID

    def __init__(
        self,
        message: str,
        hint: str | None = None,
        location: Location | None = None,
        *,
        exit_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.location = location
        if exit_code is not None:
            self.exit_code = exit_code

    def render(self) -> str:
        where = f"{self.location}: " if self.location else ""
        text = f"{where}error: {self.message}"
        if self.hint:
            text += f"\n    hint: {self.hint}"
        return text


class RecipeError(FtuneError):
    """A recipe with one or more problems; all of them are reported at once."""

    def __init__(self, problems: list[Problem], file: str | None = None) -> None:
        self.problems = problems
        self.file = file
        n = len(problems)
        super().__init__(f"{n} problem{'s' if n != 1 else ''} in recipe{f' {file}' if file else ''}")

    def render(self) -> str:
        lines = [p.render() for p in self.problems]
        errors = sum(p.severity == "error" for p in self.problems)
        lines.append(f"{errors} error{'s' if errors != 1 else ''}")
        return "\n".join(lines)


class UsageError(FtuneError):
    """Bad command-line usage or an unreadable input file."""

    exit_code = EXIT_USAGE


class RunError(FtuneError):
    """The run failed after launch (a crashed worker, a failed save check)."""

    exit_code = EXIT_RUNTIME


def disk_full(err: OSError, where: object) -> FtuneError | None:
    """ENOSPC / EDQUOT as a user error naming the path that ran out of space (`where` when the OS gave none)."""
    import errno

    if err.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    path = err.filename or where
    return FtuneError(f"no space left on the device holding {path} ({err.strerror})",
                      hint=f"free space there (`df -h {path}`) or point output.dir at another disk, then rerun "
                      "the same command: every complete checkpoint is kept", exit_code=EXIT_RUNTIME)
