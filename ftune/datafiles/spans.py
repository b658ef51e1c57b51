"""Answer spans: where each assistant turn's trained text lies in a rendered conversation.

The definition: a turn's span runs from the end of the prompt rendered up to it (with the generation prompt) to
the end of the conversation rendered through it, trailing whitespace excluded, so end-of-turn tokens are trained
too. Where that does not hold (the turn opens the conversation, or the template rewrites earlier turns: not
prefix-stable), the span is the turn's content, found in the rendering.

Two ways to get it:

- One render (`ChatRenderer.tracked`), for templates whose turns are marked with `{% generation %}`: the
  built-ins and ftune's default through their tagged siblings (each turn's whole output tagged, so the span is the
  block less the generation prompt at its head), and a user's or the hub's template with tags of its own (the
  tagged text is the span, trailing whitespace excluded).
- Renders of the prefixes (`_by_prefixes`), 1 + 2 x (assistant turns) - 1 a row, for every other template.

The one-render spans equal the prefix spans on every built-in (tested on random conversations).
"""

from __future__ import annotations

from collections.abc import Callable

from ftune.datafiles.chat_rows import ChatRenderer

Render = ChatRenderer | Callable[[list[dict], bool], str]
Span = tuple[int, int]


def render_with_spans(render: Render, messages: list[dict]) -> tuple[str, list[Span]]:
    """The conversation rendered, and the character span of every assistant turn (module docstring). `render`: a
    ChatRenderer, or any `render(messages, generation_prompt) -> str` (the vision rows' processor), which renders
    the prefixes."""
    kind = getattr(render, "spans_kind", None)
    tracked = render.tracked(messages) if kind else None
    if tracked is None:
        return _by_prefixes(render, messages)
    full, blocks = tracked
    if kind == "tags":  # the template's author says what is trained
        return full, [(s, max(s, _rstrip_end(full, e))) for s, e in blocks if e > s]
    turns = blocks if len(blocks) == len(messages) else _turn_blocks(messages, blocks)  # (the common case first)
    if turns is None:  # a block per message, per non-system message or per answer: none of these
        return _by_prefixes(render, messages)
    prompt = render.generation_prompt()

    def turn(k: int) -> Span | None:
        s, e = turns[k]
        # the prompt rendered up to this turn is full[:s] + prompt; the conversation through it is full[:e]
        if k and full.startswith(prompt, s) and e > s + len(prompt):
            return s + len(prompt), _rstrip_end(full, e)
        return None

    return full, _answer_spans(full, messages, turn)


def _by_prefixes(render: Render, messages: list[dict]) -> tuple[str, list[Span]]:
    """The spans from renders of the prefixes; the conversation through its last message is the full rendering,
    so a single-turn row costs two renders, not three."""
    full, last = render(messages, False), len(messages) - 1

    def turn(k: int) -> Span | None:
        before = render(messages[:k], True) if k else None
        through = full if k == last else render(messages[: k + 1], False)
        if before is not None and full.startswith(before) and full.startswith(through) and len(through) > len(before):
            return len(before), len(through.rstrip())
        return None

    return full, _answer_spans(full, messages, turn)


def _answer_spans(full: str, messages: list[dict], turn: Callable[[int], Span | None]) -> list[Span]:
    """Each assistant turn's span: `turn(k)`'s, else (the turn opens the conversation, or the template is not
    prefix-stable) the turn's content found in the rendering after the previous span."""
    spans, cursor = [], 0
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        found = turn(k)
        if found is not None:
            start, end = found
        else:
            start = full.find(m["content"], cursor)
            if start < 0:
                continue
            end = start + len(m["content"])
        spans.append((start, max(start, end)))
        cursor = end
    return spans


def _turn_blocks(messages: list[dict], blocks: list) -> dict[int, Span] | None:
    """Message index -> its tagged block. A sibling tags every message's output (chatml, llama3, ...), every
    non-system one (gemma folds the system turn into the next), or the answers only (alpaca, mistral): the count
    of blocks says which, and where two of these give the same count they pick the same messages."""
    for keep in (lambda r: True, lambda r: r != "system", lambda r: r == "assistant"):
        ks = [k for k, m in enumerate(messages) if keep(m["role"])]
        if len(ks) == len(blocks):
            return dict(zip(ks, blocks))
    return None


def _rstrip_end(text: str, end: int) -> int:
    """len(text[:end].rstrip()), without the copy."""
    while end and text[end - 1].isspace():
        end -= 1
    return end
