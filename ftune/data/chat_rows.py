"""Chat rows as the formats read them: messages normalized to {role, content} with the source's role map, and
the anomalies counted in the data report (an assistant first, a user twice, empty content)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ftune.data.errors import chat_fields_hint
from ftune.typed import not_text

if TYPE_CHECKING:
    from ftune.data.sources import Source

ROLES = ("system", "user", "assistant", "tool")
DEFAULT_ROLE_MAP = {"human": "user", "gpt": "assistant", **{r: r for r in ROLES}}

DEFAULT_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>\\n' }}{%- endif -%}"
)
"""ftune's chat template when neither data.chat_template nor the tokenizer gives one."""


def normalize_messages(messages, src: Source, i: int, fail) -> list[dict]:
    """Messages as [{role, content}] with roles mapped to system/user/assistant/tool."""
    f = src.spec.fields
    mapping = {**DEFAULT_ROLE_MAP, **(src.spec.roles or {})}
    if not isinstance(messages, list):
        raise fail(i, f"field `{f.messages}` must be a list of messages, got {type(messages).__name__}")
    if messages and (wrong := not_text(messages)) is not None and wrong[0] == "a list of token ids":
        raise fail(i, f"field `{f.messages}` holds {wrong[0]}, not messages", hint=wrong[1])
    out = []
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or f.role not in m or f.content not in m:
            keys = ", ".join(m) if isinstance(m, dict) else type(m).__name__
            raise fail(
                i,
                f"message {k + 1} needs keys `{f.role}` and `{f.content}`, has: {keys}",
                hint=chat_fields_hint(f.messages, m),
            )
        role = mapping.get(m[f.role]) if isinstance(m[f.role], str) else None
        if role not in ROLES:
            raise fail(
                i,
                f"message {k + 1} has unknown role {m[f.role]!r} (known: {', '.join(sorted(mapping))})",
                hint=f"map it in the source, e.g. `roles: {{{m[f.role]}: assistant}}`",
            )
        if (wrong := not_text(m[f.content])) is not None:  # content parts (images) would be stringified
            raise fail(i, f"message {k + 1}'s `{f.content}` holds {wrong[0]}, not text", hint=wrong[1])
        out.append({"role": role, "content": "" if m[f.content] is None else str(m[f.content])})
    return out


ANOMALIES = ("assistant_first", "user_twice", "empty_content")


def chat_anomalies(messages: list[dict]) -> set[str]:
    """Which likely mistakes a normalized conversation shows: the assistant speaking first (after any system
    turn), two user turns in a row, a message with empty content. Templates render them; training on them
    teaches the wrong turn-taking."""
    found = set()
    turns = [m for m in messages if m["role"] != "system"]
    if turns and turns[0]["role"] == "assistant":
        found.add("assistant_first")
    if any(a["role"] == b["role"] == "user" for a, b in zip(turns, turns[1:])):
        found.add("user_twice")
    if any(not m["content"].strip() for m in messages):
        found.add("empty_content")
    return found


def anomaly_bits(messages: list[dict]) -> int:
    """`chat_anomalies` as a bit mask (bit k: ANOMALIES[k]), the `_anomalies` bookkeeping column of chat rows."""
    found = chat_anomalies(messages)
    return sum(1 << k for k, kind in enumerate(ANOMALIES) if kind in found)


def count_anomalies(bits, rows) -> tuple[dict[str, int], dict[str, int]]:
    """Per kind, how many rows show it, and the first such row (1-based, in file order); `bits` is the
    `_anomalies` column (numpy), `rows[i]` the source row of the i-th encoded row."""
    import numpy as np

    counts, first = dict.fromkeys(ANOMALIES, 0), {}
    for k, kind in enumerate(ANOMALIES):
        hit = np.flatnonzero(bits & (1 << k))
        counts[kind] = int(hit.size)
        if hit.size:
            first[kind] = int(np.asarray(rows)[hit].min()) + 1
    return counts, first


def chat_template_of(recipe, tokenizer) -> str:
    """data.chat_template (a built-in's file or the Jinja string), else the tokenizer's, else ftune's default: the
    one choice the data stage and `ftune plan`'s token count share."""
    from ftune.chat import resolve
    if recipe.data.chat_template:
        return resolve(recipe.data.chat_template)
    own = getattr(tokenizer, "chat_template", None)
    if isinstance(own, dict):
        own = own.get("default") or next(iter(own.values()), None)
    return own or DEFAULT_CHAT_TEMPLATE
