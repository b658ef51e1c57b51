"""A saved folder's tensors read back without their data: the run's save check (`ftune.worker.verify`) and
`ftune merge`'s check of the merged folder."""

from __future__ import annotations

from pathlib import Path


def saved_tensors(folder: Path) -> dict[str, tuple[int, ...]]:
    """Names and shapes of every tensor in the folder's safetensors files (no data read)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes
