"""Chat rows as the formats read them: messages normalized to {role, content} with the source's role map, and
the anomalies counted in the data report (an assistant first, a user twice, empty content)."""

from __future__ import annotations

from itertools import accumulate
from typing import TYPE_CHECKING

from ftune.datafiles.errors import chat_fields_hint
from ftune.typed import not_text

if TYPE_CHECKING:
    from ftune.datafiles.sources import Source

ROLES = ("system", "user", "assistant", "tool")
DEFAULT_ROLE_MAP = {"human": "user", "gpt": "assistant", **{r: r for r in ROLES}}
_ROLE_SET = frozenset(ROLES)

DEFAULT_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>\\n' }}{%- endif -%}"
)
"""ftune's chat template when neither data.chat_template nor the tokenizer gives one."""
DEFAULT_CHAT_TEMPLATE_SPANS = (
    "{%- for message in messages -%}"
    "{%- generation -%}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{%- endgeneration -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>\\n' }}{%- endif -%}"
)
"""DEFAULT_CHAT_TEMPLATE with each turn tagged, for the answer spans in one render (like the built-ins' siblings)."""


def normalize_messages(messages, src: Source, i: int, fail) -> list[dict]:
    """Messages as [{role, content}] with roles mapped to system/user/assistant/tool; an assistant message's
    `tool_calls` ([{"function": {"name", "arguments"}}], as chat templates take them) is kept."""
    f = src.spec.fields
    mapping = {**DEFAULT_ROLE_MAP, **(src.spec.roles or {})}
    if not isinstance(messages, list):
        raise fail(i, f"field `{f.messages}` must be a list of messages, got {type(messages).__name__}")
    if messages and not isinstance(messages[0], dict) and (wrong := not_text(messages)) is not None and \
            wrong[0] == "a list of token ids":  # (not_text walks every message: only where it can be ids)
        raise fail(i, f"field `{f.messages}` holds {wrong[0]}, not messages", hint=wrong[1])
    out = []
    role_key, content_key = f.role, f.content
    for k, m in enumerate(messages):
        # the common row first: a dict with a known role and string content (the checks below, all passed)
        if type(m) is dict and type(r := m.get(role_key)) is str and type(c := m.get(content_key)) is str and \
                (role := mapping.get(r)) in _ROLE_SET and not m.get("tool_calls"):
            out.append({"role": role, "content": c})
            continue
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
        msg = {"role": role, "content": "" if m[f.content] is None else str(m[f.content])}
        if m.get("tool_calls"):  # an assistant's structured calls: the chat template writes them (hermes)
            if role != "assistant" or not isinstance(m["tool_calls"], list):
                raise fail(i, f"message {k + 1}: `tool_calls` is a list, on an assistant message")
            msg["tool_calls"] = [_tool_call(c, lambda why: fail(i, f"message {k + 1}: {why}"))
                                 for c in m["tool_calls"]]
        out.append(msg)
    return out


def _tool_call(call, fail) -> dict:
    """One call as `{"type": "function", "function": {"name", "arguments": {...}}}`: `arguments` may be a JSON
    string; keys holding null are left out (a JSON Lines file read as Arrow gives every call every argument name
    of the file, null where absent)."""
    import json

    fn = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise fail("a tool call is {\"name\": ..., \"arguments\": {...}} (or under \"function\")")
    args = fn.get("arguments") or {}
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            raise fail(f"tool call {fn['name']!r}: `arguments` is not JSON") from None
    if not isinstance(args, dict):
        raise fail(f"tool call {fn['name']!r}: `arguments` is an object of name: value")
    return {"type": "function", "function": {"name": fn["name"],
                                             "arguments": {k: v for k, v in args.items() if v is not None}}}


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
    if any(not m["content"].strip() and not m.get("tool_calls") for m in messages):
        found.add("empty_content")
    return found


def anomaly_bits(messages: list[dict]) -> int:
    """`chat_anomalies` as a bit mask (bit k: ANOMALIES[k]), the `_anomalies` bookkeeping column of chat rows, in
    one pass over the messages (it runs on every chat row; tested equal to `chat_anomalies`)."""
    bits, previous = 0, None
    for m in messages:
        if not m["content"].strip() and not m.get("tool_calls"):
            bits |= 4  # empty_content
        role = m["role"]
        if role == "system":
            continue
        if previous is None and role == "assistant":
            bits |= 1  # assistant_first
        elif role == "user" and previous == "user":
            bits |= 2  # user_twice
        previous = role
    return bits


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


class ChatRenderer:
    """Renders plain `{role, content}` conversations with one chat template, exactly as
    `tokenizer.apply_chat_template(messages, chat_template=..., tokenize=False)` does, without its per-call work
    (argument checks, a deep copy of the messages and of the special-token map on every call): the template is
    compiled once by transformers' own sandboxed compiler and the tokenizer's special tokens are bound once.
    Rendering is most of a chat source's preprocessing time: 5.5x faster per call here (docs/data.md).
    Falls back to `apply_chat_template` where transformers lacks the compiler.

    `tracked(messages)` renders once with transformers' generation tracker, where the template marks turns with
    `{% generation %}`: `spans_kind` says which text it renders ("tags": the template's own tags; "sibling": the
    tagged sibling of a built-in whose text this template is, ftune.chat.spans_sibling; None: no tracked render,
    ftune.datafiles.spans renders prefixes instead). `renders` counts renders (the tests read it)."""

    def __init__(self, tokenizer, template: str) -> None:
        self.tokenizer, self.template = tokenizer, template
        self.spans_template, self.spans_kind = _spans_template(template)
        self.renders = 0
        self._fn = self._tracked = self._generation_prompt = None

    def __getstate__(self) -> dict:  # datasets pickles map functions (num_proc > 1); a compiled template does not
        return {**self.__dict__, "_fn": None, "_tracked": None}

    def __call__(self, messages: list[dict], generation_prompt: bool) -> str:
        if self._fn is None:
            self._fn = self._compile(self.template)
        self.renders += 1
        return self._fn(messages, generation_prompt)

    def generation_prompt(self) -> str:
        """What the generation prompt adds to a rendering (a constant of every built-in: '<|im_start|>assistant\\n',
        '' for mistral), from one probe conversation, once; "\\0" (never a prefix) when it doesn't add to it."""
        if self._generation_prompt is None:
            probe = [{"role": "user", "content": "x"}]
            without, with_prompt = self(probe, False), self(probe, True)
            self._generation_prompt = with_prompt[len(without):] if with_prompt.startswith(without) else "\0"
        return self._generation_prompt

    def tracked(self, messages: list[dict]) -> tuple[str, list[tuple[int, int]]] | None:
        """The conversation rendered (no generation prompt) and the character span of each `{% generation %}`
        block in it, in order; None where this template has no tracked render."""
        if self._tracked is None:
            if self.spans_kind == "sibling":
                self._tracked = _marked(self._compile(_marks_for_tags(self.spans_template)))
            else:
                self._tracked = (self.spans_kind and self._compile(self.spans_template, tracked=True)) or False
        if self._tracked is False:
            return None
        self.renders += 1
        return self._tracked(messages)

    def _compile(self, template: str, tracked: bool = False):
        tok = self.tokenizer
        try:
            from transformers.utils.chat_template_utils import _compile_jinja_template, _plain_template_data
        except ImportError:  # another transformers: the public path, slower
            if tracked:
                return None
            return lambda msgs, gen: tok.apply_chat_template(msgs, chat_template=template, tokenize=False,
                                                             add_generation_prompt=gen)
        compiled = _compile_jinja_template(template)
        special = _plain_template_data(dict(tok.special_tokens_map))
        # `compiled.render(**kw)` merges the template's globals (a ChainMap, read key by key) into a new dict on
        # every call: merged once here, a render takes 8 us instead of 20 (CPU, ftune's default template)
        flat_globals = dict(compiled.globals)
        base = {**flat_globals, **special, "tools": None, "documents": None}
        env, root, name, blocks = compiled.environment, compiled.root_render_func, compiled.name, compiled.blocks
        activate = getattr(env, "activate_tracker", None)
        if tracked and activate is None:
            return None

        def render(msgs: list[dict], gen: bool) -> str:
            # what `compiled.new_context(vars, shared=True)` builds, with the globals' keys read from a plain dict
            context = env.context_class(env, {**base, "messages": msgs, "add_generation_prompt": gen}, name, blocks,
                                        globals=flat_globals)
            try:
                return env.concat(root(context))
            except Exception:  # noqa: BLE001 - jinja's own handling, as Template.render does
                env.handle_exception()

        def render_tracked(msgs: list[dict]) -> tuple[str, list[tuple[int, int]]]:
            # transformers' `_render_with_assistant_indices`, on the bound context: the tracker reads the pieces
            # rendered so far to place each `{% generation %}` block
            context = env.context_class(env, {**base, "messages": msgs, "add_generation_prompt": False}, name,
                                        blocks, globals=flat_globals)
            pieces: list[str] = []
            spans: list[tuple[int, int]] = []
            try:
                with activate(pieces, spans):
                    pieces.extend(root(context))
            except Exception:  # noqa: BLE001
                env.handle_exception()
            return "".join(pieces), spans

        return render_tracked if tracked else render


# A sibling's tags become these two characters (private use), rendered as text and then cut out: the same one
# render, at a plain render's cost (transformers' tracker calls a Jinja macro per block and joins the text so far:
# it made the one render slower than the 3.5 plain ones on ftune's default template).
_OPEN, _CLOSE = "\ue000", "\ue001"


def _marks_for_tags(sibling: str) -> str:
    """The sibling with `{%- generation -%}` / `{%- endgeneration -%}` written as outputs of the two marks, whitespace
    control alike (the siblings write the tags only in this form: tested)."""
    opening, closing = "{{- '" + _OPEN + "' -}}", "{{- '" + _CLOSE + "' -}}"
    return sibling.replace("{%- generation -%}", opening).replace("{%- endgeneration -%}", closing)


def _marked(render):
    """`ChatRenderer.tracked` from a render of the marked sibling; None for a conversation whose text holds a mark."""

    def tracked(msgs: list[dict]) -> tuple[str, list[tuple[int, int]]] | None:
        for m in msgs:
            if _OPEN in m["content"] or _CLOSE in m["content"]:
                return None
        pieces = render(msgs, False).replace(_CLOSE, _OPEN).split(_OPEN)
        at = list(accumulate(map(len, pieces)))  # where each mark stood, once the marks are cut
        return "".join(pieces), list(zip(at[0::2], at[1::2]))

    return tracked


def _spans_template(template: str) -> tuple[str | None, str | None]:
    """The tagged text `ChatRenderer.tracked` renders for `template`, and its kind (see there)."""
    from ftune.chat import GENERATION_TAG

    if GENERATION_TAG.search(template):
        return template, "tags"
    sibling = _siblings().get(template)
    return (sibling, "sibling") if sibling is not None else (None, None)


_SIBLINGS: dict[str, str] = {}


def _siblings() -> dict[str, str]:
    """Shipped template text -> its tagged sibling, for every built-in and ftune's default."""
    if not _SIBLINGS:
        from ftune.chat import BUILTIN, builtin, spans_sibling

        _SIBLINGS.update({builtin(n): spans_sibling(n) for n in BUILTIN})
        _SIBLINGS[DEFAULT_CHAT_TEMPLATE] = DEFAULT_CHAT_TEMPLATE_SPANS
    return _SIBLINGS
