"""A model named by its hub id, the way clusters hold it: `hf download` on a login node fills the Hugging Face cache
(`$HF_HOME/hub/models--org--name/snapshots/<sha>/`, `refs/<revision>`), and jobs run with `HF_HUB_OFFLINE=1`.

Offline, an id is the cache's snapshot or nothing; online, loading goes to the hub (which fills the cache), so
only a local folder or an offline id can be missing. Every check that asks "is this model here" (`validate
--check-paths`, the compiler, `eval`/`merge`/`export`/`generate`) asks here, with one wording that names the
folder searched and the download command. Light: huggingface_hub's cache lookup only (no torch).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ftune.errors import Problem

_TRUE = ("1", "true", "yes", "on")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
"""A folder or snapshot holds a tokenizer when it holds one of these."""

_DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".txt", ".arrow")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def looks_local(value: str) -> bool:
    """A path the user means as local: absolute, ./ ~, a data file name, or not a hub id (org/name).
    `ftune validate --check-paths` and `ftune run` both decide with this."""
    return value.startswith(("/", ".", "~")) or value.endswith(_DATA_SUFFIXES) or not _HUB_ID.match(value)



def offline(environ=None) -> bool:
    """The hub is off (huggingface_hub's and transformers' variables): ids resolve through the cache alone."""
    env = os.environ if environ is None else environ
    return any(env.get(name, "").strip().lower() in _TRUE for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def cache_root() -> Path:
    """The hub cache huggingface_hub, and so transformers, reads in this process (HF_HUB_CACHE, else $HF_HOME/hub,
    else ~/.cache/huggingface/hub, as the environment was when it was imported)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def repo_folder(repo_id: str) -> Path:
    """The cache folder of a model id: models--org--name."""
    return cache_root() / f"models--{repo_id.replace('/', '--')}"


def cached_file(repo_id: str, filename: str, revision: str | None = None) -> Path | None:
    """`filename` of the id's snapshot at `revision` (a branch, tag or commit; default main), if the cache holds it."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, filename, cache_dir=cache_root(), revision=revision)
    except Exception:  # not a valid repo id: nothing cached under it
        return None
    return Path(found) if isinstance(found, str) else None


def dataset_snapshot(repo_id: str, revision: str | None = None) -> Path | None:
    """The snapshot folder of a hub dataset in the cache (`datasets--org--name/snapshots/<commit>/`, what
    `datasets.load_dataset` downloads its files into), at `revision` (a branch, tag or commit; default main), or
    None when the cache doesn't hold it. Nothing is downloaded."""
    if looks_local(repo_id):
        return None
    repo = cache_root() / f"datasets--{repo_id.replace('/', '--')}"
    ref = repo / "refs" / (revision or "main")
    commit = ref.read_text().strip() if ref.is_file() else (revision or "")
    folder = repo / "snapshots" / commit
    return folder if commit and folder.is_dir() else None


def snapshot(repo_id: str, revision: str | None = None, marker: str = "config.json") -> Path | None:
    """The snapshot folder of the id at `revision`, if it holds `marker` (config.json for a model,
    adapter_config.json for an adapter): the folder transformers loads offline."""
    found = cached_file(repo_id, marker, revision)
    return found.parent if found is not None else None


def folder(value: str, revision: str | None = None, marker: str = "config.json") -> Path | None:
    """The local folder a model name stands for: the folder itself, else the id's cached snapshot (holding
    `marker`); None when neither is on this machine."""
    local = Path(value).expanduser()
    if local.is_dir():
        return local
    return None if value.startswith(("/", ".", "~")) else snapshot(value, revision, marker)


def missing(key: str, value: str, revision: str | None = None, what: str = "model",
            markers: tuple[str, ...] = ("config.json",)) -> Problem | None:
    """A hub id the hub can't supply: offline and not in the cache (with any of `markers`). The message names the
    cache folder searched; the hint, the download command. None when it is there, or online (the hub has it or
    says so when loading)."""
    if not offline() or any(cached_file(value, m, revision) is not None for m in markers):
        return None
    repo = repo_folder(value)
    if not repo.is_dir():
        why = f"no such folder here, and not in the Hugging Face cache (searched {repo})"
    elif revision is not None and not ((repo / "refs" / revision).is_file()
                                       or (repo / "snapshots" / revision).is_dir()):
        why = f"the Hugging Face cache ({repo}) holds no revision {revision}"
    else:
        why = (f"its snapshot{f' at revision {revision}' if revision else ''} in the Hugging Face cache ({repo}) "
               f"has {'no ' + markers[0] if len(markers) == 1 else 'none of ' + ', '.join(markers)}")
    return Problem.at(key, f"{what} {value}: {why}; the hub is offline (HF_HUB_OFFLINE=1)",
                      "download it where there is network, into the cache this job reads (HF_HOME): "
                      f"`{download_command(value, revision)}`")


def download_command(repo_id: str, revision: str | None = None) -> str:
    return f"hf download {repo_id}" + (f" --revision {revision}" if revision else "")
