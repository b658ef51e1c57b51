"""Durations as the progress lines show them (training, generation): h:mm:ss."""

from __future__ import annotations


def clock(seconds: float) -> str:
    """h:mm:ss, as the progress bar shows it."""
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
