"""The preprocessed-data cache: a `save_to_disk` folder per key, written atomically, never stale.

The key hashes everything that changes the tokens: the data files' bytes, the tokenizer (its
serialized state and special tokens), the chat template, the recipe's data section (+ task, labels,
seed) and FORMAT_VERSION, bumped whenever the formatting code changes its output. Each entry keeps a
`manifest.json` of those parts, so a miss can say which part changed since the last entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from ftune.outputs import publish_entry

# 2: chat anomaly counts in the report; 3: classification truncation keeps [SEP]; 4: packing in shards, realised mix;
# 5: packing shards of 1M tokens (was 4M), pretokenized rows drop the padding under an attention mask;
# 6: packed rows written shard by shard into the entry (Arrow files per ~32M tokens), shuffled within their shard;
# 7: a chat template with its own `{% generation %}` tags trains its tagged text (the built-ins' labels are unchanged)
# 8: each sample's source and row kept in origins.npz (`ftune data` labels)
FORMAT_VERSION = 8


def sha(value) -> str:
    data = value if isinstance(value, bytes) else json.dumps(value, sort_keys=True, default=str).encode()
    return hashlib.sha256(data).hexdigest()


def tokenizer_fingerprint(tokenizer) -> str:
    """Hash of what decides the tokens: the serialized tokenizer (vocab, merges, normalizer, post-processor)
    and its special tokens. In-memory, so a tokenizer changed after loading is caught as well as edited files."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    state = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    # The pad token only matters to the collator (the tokenizer stage sets pad = eos when there is none),
    # so it is left out: `ftune data` and the worker share entries.
    special = {
        "class": type(tokenizer).__name__,
        "special": {k: str(v) for k, v in sorted(tokenizer.special_tokens_map.items()) if k != "pad_token"},
        "bos": tokenizer.bos_token_id,
        "eos": tokenizer.eos_token_id,
        "added": sorted((k, v) for k, v in tokenizer.get_added_vocab().items()),
    }
    return sha(state.encode() + sha(special).encode())


@dataclass(frozen=True)
class Key:
    """The cache key and the parts it is made of (kept in the manifest to explain misses)."""

    parts: dict
    identity: str  # which data this is about (source paths): misses are explained against the same identity

    @property
    def digest(self) -> str:
        return sha(self.parts)[:24]


def make_key(*, data_section: dict, extra: dict, files: dict[str, str | None], tokenizer: str, template: str) -> Key:
    parts = {
        "format_version": FORMAT_VERSION,
        "data_section": data_section,
        "task": extra,
        "data_files": files,
        "tokenizer": tokenizer,
        "chat_template": sha(template),
    }
    return Key(parts=parts, identity=sha(sorted(files))[:16])


class Cache:
    """Entries under `root/<digest>/` with `manifest.json`, `report.json` and the saved datasets."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def entry(self, key: Key) -> Path:
        return self.root / key.digest

    def lookup(self, key: Key) -> Path | None:
        path = self.entry(key)
        return path if (path / "manifest.json").exists() else None

    def scratch(self) -> Path:
        """A fresh temporary folder beside the entries (same filesystem, so the final rename is atomic)."""
        path = self.root / f".tmp-{uuid.uuid4().hex[:12]}"
        path.mkdir(parents=True)
        return path

    def commit(self, scratch: Path, key: Key) -> Path:
        """Move a finished scratch folder into place; if another process won the race, keep theirs
        (`ftune.outputs.publish_entry`, the one first-writer-wins publish; the manifest, written last in the
        private scratch folder, is what makes an entry done)."""
        files = {p.relative_to(scratch).as_posix(): p.stat().st_size for p in sorted(scratch.rglob("*")) if p.is_file()}
        (scratch / "manifest.json").write_text(
            json.dumps({"key": key.digest, "identity": key.identity, "created": time.time(), "parts": key.parts,
                        "files": files}, indent=1, default=str)
        )
        return publish_entry(scratch, self.entry(key), done=lambda entry: (entry / "manifest.json").exists())

    def verify(self, entry: Path) -> str | None:
        """Why an entry can't be trusted (a file missing, truncated or unreadable), or None when it is whole.

        The manifest, written last, records every file's size; a crash, a full disk or a hand edit that left
        a file short or missing shows up here instead of failing every rerun the same way."""
        try:
            manifest = json.loads((entry / "manifest.json").read_text())
            files = manifest["files"]
        except (OSError, ValueError, KeyError, TypeError):
            return "its manifest.json is unreadable"
        if "report.json" not in files:
            return "it has no report.json"
        for name, size in files.items():
            path = entry / name
            if not path.is_file():
                return f"{name} is missing"
            if path.stat().st_size != size:
                return f"{name} has {path.stat().st_size} bytes, {size} were written"
        try:
            json.loads((entry / "report.json").read_text())
        except (OSError, ValueError):
            return "its report.json is unreadable"
        return None

    def discard(self, entry: Path) -> None:
        """Remove a bad entry: renamed aside first (atomic), so no reader sees it half-deleted."""
        trash = self.root / f".tmp-bad-{uuid.uuid4().hex[:12]}"
        try:
            os.rename(entry, trash)
        except OSError:
            return  # another process already moved it
        shutil.rmtree(trash, ignore_errors=True)

    def why_miss(self, key: Key) -> str:
        """Which parts differ from the newest entry for the same data files, in words."""
        best, best_time = None, -1.0
        for manifest in self.root.glob("*/manifest.json"):
            try:
                m = json.loads(manifest.read_text())
            except (OSError, ValueError):
                continue
            if m.get("identity") == key.identity and m.get("created", 0) > best_time:
                best, best_time = m, m.get("created", 0)
        if best is None:
            return "no cache entry for these data files yet"
        return "; ".join(_diff(best.get("parts", {}), json.loads(json.dumps(key.parts, default=str))))


def _diff(old: dict, new: dict) -> list[str]:
    reasons = []
    if old.get("format_version") != new["format_version"]:
        was, now = old.get("format_version"), new["format_version"]
        reasons.append(f"ftune's formatting code changed (version {was} -> {now})")
    for path, h in new["data_files"].items():
        before = old.get("data_files", {}).get(path)
        if before != h:
            reasons.append(f"data file {path} changed" if before else f"new data file {path}")
    if old.get("tokenizer") != new["tokenizer"]:
        reasons.append("the tokenizer changed")
    if old.get("chat_template") != new["chat_template"]:
        reasons.append("the chat template changed")
    reasons += [f"data.{k} changed" for k in _changed_keys(old.get("data_section", {}), new["data_section"])]
    if old.get("task") != new["task"]:
        reasons.append("model.task/labels or train.seed changed")
    return reasons or ["the entry was incomplete"]


def _changed_keys(old, new, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            out += _changed_keys(old.get(k), new.get(k), f"{prefix}.{k}" if prefix else k)
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        out = []
        for i, (a, b) in enumerate(zip(old, new)):
            out += _changed_keys(a, b, f"{prefix}[{i}]")
        return out
    return [] if old == new else [prefix]
