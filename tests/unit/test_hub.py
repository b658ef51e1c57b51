"""ftune.hub: a model id in the Hugging Face cache, offline (tests/conftest.py sets HF_HUB_OFFLINE and a temp
HF_HOME). `model.revision` pins a snapshot: a branch or tag under refs/, or a commit under snapshots/."""

from __future__ import annotations

import os
from pathlib import Path

from ftune import hub

MAIN, V2 = "a" * 40, "b" * 40


def cached(repo_id: str, files: dict[str, dict[str, str]], refs: dict[str, str]) -> Path:
    """{commit: {file: text}} and {ref: commit} laid out as the hub client caches them (plain files suffice)."""
    repo = hub.repo_folder(repo_id)
    for commit, content in files.items():
        for name, text in content.items():
            (repo / "snapshots" / commit).mkdir(parents=True, exist_ok=True)
            (repo / "snapshots" / commit / name).write_text(text)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    for ref, commit in refs.items():
        (repo / "refs" / ref).write_text(commit)
    return repo


def test_a_revision_pins_the_snapshot_and_a_missing_one_is_named():
    repo = cached("acme-hub/pinned", {MAIN: {"config.json": "{}"}, V2: {"config.json": "{}", "tokenizer.json": "{}"}},
                  {"main": MAIN, "v2": V2})
    assert hub.cache_root() == Path(os.environ["HF_HOME"]) / "hub"
    assert hub.folder("acme-hub/pinned") == repo / "snapshots" / MAIN
    assert hub.folder("acme-hub/pinned", "v2") == hub.folder("acme-hub/pinned", V2) == repo / "snapshots" / V2
    assert hub.missing("model.path", "acme-hub/pinned", "v2") is None
    assert hub.missing("model.path", "acme-hub/pinned", "v2", markers=hub.TOKENIZER_FILES) is None
    p = hub.missing("model.path", "acme-hub/pinned", None, markers=hub.TOKENIZER_FILES)  # main has no tokenizer
    assert p.message == (f"model acme-hub/pinned: its snapshot in the Hugging Face cache ({repo}) has none of "
                         "tokenizer.json, tokenizer_config.json, tokenizer.model; the hub is offline "
                         "(HF_HUB_OFFLINE=1)")
    p = hub.missing("model.path", "acme-hub/pinned", "v3")
    assert p.message == (f"model acme-hub/pinned: the Hugging Face cache ({repo}) holds no revision v3; the hub is "
                         "offline (HF_HUB_OFFLINE=1)")
    assert p.hint.endswith("`hf download acme-hub/pinned --revision v3`")


def test_online_nothing_is_missing_and_local_paths_are_not_ids(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE")
    assert not hub.offline() and hub.missing("model.path", "acme-hub/never-downloaded") is None  # the hub has it
    monkeypatch.setenv("HF_HUB_OFFLINE", "true")
    assert hub.offline() and hub.missing("model.path", "acme-hub/never-downloaded") is not None
    assert hub.folder("./acme-hub/pinned") is None and hub.folder("not a repo id!") is None
