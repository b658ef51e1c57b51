"""Shared console helpers for commands: rich on a terminal, plain text otherwise."""

from __future__ import annotations

import sys

from ftune.errors import FtuneError


def print_error(err: FtuneError) -> None:
    """Render a user error on stderr: `file:line:col: error: message` and an indented hint."""
    print(err.render(), file=sys.stderr)
