"""`ftune import`: peers' configs → ftune recipes, one module per peer, registered by name.

Each peer module holds a mapping table (peer key → ftune key and a translate function) and a
`convert(file) -> Imported`; `_core` reads the YAML with line numbers and collects every key that
can't be mapped with its line and the reason. Light: PyYAML and pydantic only.
"""

from __future__ import annotations

import importlib

from ftune.importers._core import Imported, Unmapped, validate

__all__ = ["PEERS", "Imported", "Unmapped", "convert", "validate"]

# peer name (as typed on the command line) -> module
PEERS: dict[str, str] = {
    "axolotl": "ftune.importers.axolotl",
    "llama-factory": "ftune.importers.llama_factory",
    "torchtune": "ftune.importers.torchtune",
}


def convert(peer: str, file: str) -> Imported:
    """Import `file`, a config of `peer`, as an ftune recipe (raises a located FtuneError when unreadable)."""
    return importlib.import_module(PEERS[peer]).convert(file)
