"""What `model.add_tokens` and `model.special_tokens` do to the parameters, planned offline: embedding rows added
(the worker resizes when the tokenizer outgrows the embedding) and the rows that train.

The tokenizer is read as plain JSON (tokenizer.json) when it is a local folder, to know which tokens exist
already; without one, every listed token is counted as new and the tokenizer as filling the embedding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ftune.recipe.schema import Recipe


@dataclass(frozen=True)
class TokenPlan:
    embeddings: int
    """Embedding rows after the resize (the config's vocab_size when nothing is added past it)."""
    new: int
    """Tokens the tokenizer gains."""
    trained: list[int]
    """Ids whose embedding (and untied head) rows train."""
    note: str | None = None


def _vocab(folder: Path) -> dict[str, int] | None:
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    vocab = dict(data.get("model", {}).get("vocab") or {}) if isinstance(data.get("model", {}).get("vocab"),
                                                                       dict) else {}
    vocab.update({t["content"]: t["id"] for t in data.get("added_tokens", [])})
    return vocab or None


def plan_tokens(recipe: Recipe, vocab_size: int) -> TokenPlan | None:
    """None when the recipe adds or sets no token."""
    m = recipe.model
    special = m.special_tokens.model_dump(exclude_none=True) if m.special_tokens else {}
    if not special and not m.add_tokens:
        return None
    listed = list(dict.fromkeys(list(special.values()) + list(m.add_tokens or [])))
    trains = set(m.add_tokens or []) | {v for k, v in special.items() if k != "pad_token"}
    vocab = _vocab(Path(m.tokenizer or m.path).expanduser())
    note = None
    if vocab is None:
        vocab, length = {}, vocab_size
        note = f"no local tokenizer.json: the {len(listed)} token(s) in model.add_tokens/special_tokens are counted " \
               f"as new rows past vocab_size {vocab_size}"
    else:
        length = max(vocab.values()) + 1
    ids = dict(vocab)
    for token in listed:
        if token not in ids:
            ids[token] = length
            length += 1
    new = length - (max(vocab.values()) + 1 if vocab else vocab_size)
    return TokenPlan(max(vocab_size, length), new, sorted(ids[t] for t in trains), note)
