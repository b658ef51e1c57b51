"""Answer spans in one render (ftune/datafiles/spans.py): the tagged siblings of the built-in templates, the spans they
give against the prefix renders on random conversations, renders per row, and a template with its own tags."""

from __future__ import annotations

import pickle
import random
from importlib import resources

import pytest

from ftune.chat import BUILTIN, GENERATION_TAG, builtin, spans_sibling, strip_generation_tags
from ftune.datafiles.chat_rows import DEFAULT_CHAT_TEMPLATE, DEFAULT_CHAT_TEMPLATE_SPANS, ChatRenderer
from ftune.datafiles.spans import _by_prefixes, _turn_blocks, render_with_spans

TEMPLATES = {**{name: builtin(name) for name in BUILTIN}, "default": DEFAULT_CHAT_TEMPLATE}
TEXTS = ["", " ", "hi", "  padded  ", "two\nlines\n", "héllo wörld 🎉 — ok", "日本語のテキスト", "5",
         "end.\n\n",
         "a {{ brace }} and %}", "\t"]


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


def conversations(n: int, seed: int = 0):
    """Random conversations: system turns (first, in the middle, twice), 1-4 exchanges, an answer first, two
    answers in a row, empty and whitespace content, unicode; no tool turns (several templates reject them)."""
    rng = random.Random(seed)
    for _ in range(n):
        msgs = []
        if rng.random() < 0.4:
            msgs.append({"role": "system", "content": rng.choice(TEXTS)})
        for _ in range(rng.randint(1, 4)):
            if rng.random() < 0.1:
                msgs.append({"role": "system", "content": rng.choice(TEXTS)})
            if rng.random() < 0.85:
                msgs.append({"role": "user", "content": rng.choice(TEXTS)})
            msgs.append({"role": "assistant", "content": rng.choice(TEXTS)})
            if rng.random() < 0.1:
                msgs.append({"role": "assistant", "content": rng.choice(TEXTS)})
        yield msgs


@pytest.mark.parametrize("name", [*BUILTIN, "default"])
def test_the_sibling_without_its_tags_is_the_shipped_text_byte_for_byte(name):
    if name == "default":
        tagged, shipped = DEFAULT_CHAT_TEMPLATE_SPANS, DEFAULT_CHAT_TEMPLATE
    else:
        files = resources.files("ftune.chat").joinpath("templates")
        tagged = files.joinpath(f"{name}.spans.jinja").read_bytes().decode()
        shipped = files.joinpath(f"{name}.jinja").read_bytes().decode()
        assert not GENERATION_TAG.search(shipped) and spans_sibling(name) == tagged.rstrip("\n")
    assert tagged != shipped and "{%- generation -%}" in tagged
    assert strip_generation_tags(tagged) == shipped
    # only this form, which the renderer turns into its marks (chat_rows._marks_for_tags)
    opening, closing = tagged.count("{%- generation -%}"), tagged.count("{%- endgeneration -%}")
    assert len(GENERATION_TAG.findall(tagged)) == opening == closing
    assert "\ue000" not in tagged and "\ue001" not in tagged


def test_an_answer_holding_a_mark_character_renders_the_prefixes(tok):
    """The marks a sibling's tags render as are private-use characters: a row that holds one is rendered the
    general way, with the same spans."""
    render = ChatRenderer(tok, builtin("chatml"))
    conv = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a \ue000 b \ue001"}]
    assert render.tracked(conv) is None
    full, spans = render_with_spans(render, conv)
    assert (full, spans) == _by_prefixes(ChatRenderer(tok, builtin("chatml")), conv)
    assert [full[a:b] for a, b in spans] == ["a \ue000 b \ue001<|im_end|>"]


@pytest.mark.parametrize("name", [*BUILTIN, "default"])
def test_one_render_gives_the_prefix_renders_spans_on_random_conversations(tok, name):
    """The spans (and the text) of the one tracked render are those of 1 + 2 x answers - 1 renders, exactly, and a
    row costs one render."""
    one, many = ChatRenderer(tok, TEMPLATES[name]), ChatRenderer(tok, TEMPLATES[name])
    assert one.spans_kind == "sibling"
    render_with_spans(one, [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}])  # warm
    checked = 0
    for conv in conversations(300, seed=len(name)):
        try:
            expected = _by_prefixes(many, conv)
        except Exception as err:  # noqa: BLE001 - alpaca rejects a system turn past the first: so must one render
            with pytest.raises(type(err), match="no role system"):
                render_with_spans(one, conv)
            continue
        before = one.renders
        assert render_with_spans(one, conv) == expected, conv
        assert one.renders - before == 1
        checked += 1
    assert checked > 200


def test_a_template_that_is_no_built_in_renders_the_prefixes(tok):
    conv = [{"role": "system", "content": "s"}, {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
            {"role": "assistant", "content": "d"}]
    edited = ChatRenderer(tok, builtin("chatml") + " ")  # one character off a built-in: not its sibling
    assert edited.spans_kind is None and edited.tracked(conv) is None
    full, spans = render_with_spans(edited, conv)
    assert edited.renders == 1 + 2 * 2 - 1
    assert [full[a:b] for a, b in spans] == ["b<|im_end|>", "d<|im_end|>"]


def test_a_template_with_its_own_generation_tags_trains_its_tagged_text(tok):
    """A user's or the hub's template marking the answers: one render, the tagged text is the span (trailing
    whitespace excluded), whatever the prefixes would say (here the tag leaves out the end-of-turn marker)."""
    template = ("{%- for m in messages -%}{{ '<|' + m['role'] + '|>\n' }}"
                "{%- if m['role'] == 'assistant' -%}{% generation %}{{ m['content'] + ' ' }}{% endgeneration %}"
                "{%- else -%}{{ m['content'] }}{%- endif -%}{{ '<|end|>\n' }}{%- endfor -%}")
    render = ChatRenderer(tok, template)
    conv = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "first"},
            {"role": "user", "content": "again"}, {"role": "assistant", "content": "ünïcode"}]
    full, spans = render_with_spans(render, conv)
    assert render.spans_kind == "tags" and render.renders == 1
    assert full == render(conv, False) == tok.apply_chat_template(conv, chat_template=template, tokenize=False)
    assert [full[a:b] for a, b in spans] == ["first", "ünïcode"]


def test_the_tracked_renderer_survives_pickling_for_worker_processes(tok):
    render = ChatRenderer(tok, builtin("gemma"))
    conv = [{"role": "system", "content": "s"}, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    first = render_with_spans(render, conv)  # compiled now
    again = pickle.loads(pickle.dumps(render))
    assert render_with_spans(again, conv) == first and again.spans_kind == "sibling"


def test_blocks_map_to_messages_by_their_count():
    conv = [{"role": "system"}, {"role": "user"}, {"role": "assistant"}, {"role": "user"}, {"role": "assistant"}]
    blocks = [(i, i + 1) for i in range(5)]
    assert _turn_blocks(conv, blocks) == {k: (k, k + 1) for k in range(5)}  # every message
    assert _turn_blocks(conv, blocks[:4]) == {1: (0, 1), 2: (1, 2), 3: (2, 3), 4: (3, 4)}  # non-system
    assert _turn_blocks(conv, blocks[:2]) == {2: (0, 1), 4: (1, 2)}  # the answers
    assert _turn_blocks(conv, blocks[:3]) is None  # none of these: the prefix renders
