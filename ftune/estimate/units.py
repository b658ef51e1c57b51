"""Byte sizes as people write and read them: `80GiB` in, `80.00 GiB` out."""

from __future__ import annotations

import re

from ftune.errors import FtuneError

GiB = 1024**3


def fmt_bytes(n: int | float) -> str:
    for unit, size in (("GiB", GiB), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def parse_bytes(text: str, what: str = "memory size", *, decimal: bool = False) -> int:
    """`80GiB`, `80GB`, `81920MiB`, `512B` -> bytes; a unit is required (`80` alone is an error, not 80 bytes) and
    the size must be positive. GB and GiB both read as binary (GPU makers' GB), unless `decimal` (HF's shard
    sizes: 5GB = 5 * 10**9, as transformers reads them)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgGtT]i?[bB]?|[bB])?\s*", str(text))
    if not m:
        raise FtuneError(f"cannot read {what} {text!r}", hint="write a number and a unit, e.g. 80GiB, 24GB or 16384MiB")
    if not m.group(2):
        raise FtuneError(f"{what} {text!r} has no unit", hint=f"write e.g. {m.group(1)}GiB or {m.group(1)}MiB "
                         "(a bare number would be read as bytes)")
    value, unit = float(m.group(1)), m.group(2).lower()
    power = {"b": 0, "k": 1, "m": 2, "g": 3, "t": 4}[unit[:1]]
    base = 1000 if decimal and "i" not in unit else 1024
    size = int(value * base**power)
    if size <= 0:
        raise FtuneError(f"{what} {text!r} must be more than 0 bytes", hint="write e.g. 80GiB")
    return size
