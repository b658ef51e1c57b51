"""Built-in chat templates, `as_chat` instruction rows, the stop-token check, and tokens added to the tokenizer."""

from __future__ import annotations

import json

import pytest

from ftune.chat import BUILTIN, builtin, resolve
from ftune.recipe.schema import Recipe
from tests.data_stage import build
from ftune.datafiles.formats import ChatRenderer, render_with_spans
from ftune.datastage.tokenizer import apply_tokens, trained_token_ids

CONVERSATION = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"}, {"role": "user", "content": "add 2 and 3"},
                {"role": "assistant", "content": "5"}]
END = {"llama3": "<|eot_id|>", "chatml": "<|im_end|>", "qwen": "<|im_end|>", "qwen3": "<|im_end|>", "mistral": "</s>",
       "gemma": "<end_of_turn>", "phi3": "<|end|>", "alpaca": "</s>", "hermes": "<|im_end|>"}


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


def test_names_resolve_to_the_shipped_files_and_strings_pass_through():
    assert set(BUILTIN) == set(END)
    assert resolve("chatml") == builtin("chatml") and "<|im_start|>" in resolve("chatml")
    assert resolve("{{ messages }}") == "{{ messages }}" and resolve(None) is None


@pytest.mark.parametrize("name", BUILTIN)
def test_every_built_in_trains_each_answer_through_its_end_of_turn(tok, name):
    """Prefix-stable rendering: each assistant span is the answer plus the template's end-of-turn marker."""
    full, spans = render_with_spans(ChatRenderer(tok, builtin(name)), CONVERSATION)
    answers = [full[a:b].strip() for a, b in spans]
    think = "<think>\n\n</think>\n\n" if name == "qwen3" else ""  # Qwen3's empty thought: trained, as in LLaMA-Factory
    assert answers == [f"{think}hello{END[name]}", f"{think}5{END[name]}"]
    assert "be brief" in full and "add 2 and 3" in full


def test_chatml_and_llama3_render_exactly(tok):
    chatml, _ = render_with_spans(ChatRenderer(tok, builtin("chatml")), CONVERSATION[1:3])
    assert chatml == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
    llama, _ = render_with_spans(ChatRenderer(tok, builtin("llama3")), CONVERSATION[1:3])
    assert llama == ("<s><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                     "<|start_header_id|>assistant<|end_header_id|>\n\nhello<|eot_id|>")


def _build(tok, tmp_path, source: dict, **data):
    path = tmp_path / "d.jsonl"
    rows = [{"instruction": "add 2 and 3", "input": "", "output": "5"}, {"instruction": "add", "input": "4 and 4",
                                                                         "output": "8"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = Recipe.model_validate({"name": "t", "model": {"path": "unused"}, "data": {
        "train": [{"path": str(path), "format": "instruction", **source}], "shuffle": False,
        "cache_dir": str(tmp_path / "cache"), **data}})
    return build(recipe, tok, log=lambda _: None)


def trained(tok, row) -> str:
    return tok.decode([t for t, lab in zip(row["input_ids"][1:], row["labels"][1:]) if lab != -100])


def test_as_chat_renders_one_user_and_one_assistant_turn(tok, tmp_path):
    b = _build(tok, tmp_path, {"as_chat": True}, chat_template="alpaca")
    first, second = b.train[0], b.train[1]
    assert trained(tok, first) == "5</s>" and trained(tok, second) == "8</s>"
    assert "### Instruction:\nadd\n\n4 and 4\n\n### Response:\n8</s>" in tok.decode(second["input_ids"])
    assert b.report.sources[0].turns == 2 and b.report.sources[0].unstopped == 0
    assert not any("WARNING" in line for line in b.report.lines())


def test_an_end_of_turn_marker_the_tokenizer_splits_is_flagged(tok, tmp_path):
    """chatml on a tokenizer without <|im_end|>: the answer ends in pieces of text, never a stop token."""
    b = _build(tok, tmp_path, {"as_chat": True}, chat_template="chatml")
    src = b.report.sources[0]
    assert (src.turns, src.unstopped, src.stops) == (2, 2, ["</s>"])
    warning = [line for line in b.report.lines() if "WARNING" in line]
    assert warning and "2 of 2 trained answers end without a trained stop token" in warning[0]
    assert "model.add_tokens" in warning[0]


def test_added_tokens_make_the_marker_one_trained_stop(tmp_path, tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    from ftune.recipe.schema import ModelSection

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    before = len(tok)
    model = ModelSection(path="unused", add_tokens=["<|im_start|>"], special_tokens={"eos_token": "<|im_end|>"})
    apply_tokens(tok, model)
    assert len(tok) == before + 2 and tok.eos_token == "<|im_end|>"
    assert trained_token_ids(tok, model) == [before, before + 1]
    b = _build(tok, tmp_path, {"as_chat": True}, chat_template="chatml")
    src = b.report.sources[0]
    assert (src.turns, src.unstopped) == (2, 0)
    labels = [lab for lab in b.train[0]["labels"] if lab != -100]
    assert labels[-1] == tok.convert_tokens_to_ids("<|im_end|>") and trained(tok, b.train[0]) == "5<|im_end|>"


def test_the_template_used_travels_with_the_tokenizer(tiny_tokenizer_dir, tmp_path):
    from ftune.datafiles.formats import DEFAULT_CHAT_TEMPLATE
    from ftune.datastage.tokenizer import load

    def recipe(**data):
        return Recipe.model_validate({"name": "t", "model": {"path": "unused"}, "data": {
            "train": [{"path": "d.jsonl", "format": "chat"}], **data}})

    assert load(str(tiny_tokenizer_dir), recipe(chat_template="phi3")).chat_template == builtin("phi3")
    assert load(str(tiny_tokenizer_dir), recipe()).chat_template == DEFAULT_CHAT_TEMPLATE  # it has none of its own
    text = Recipe.model_validate({"name": "t", "model": {"path": "unused"}, "data": {"train": [{"path": "d"}]}})
    assert not load(str(tiny_tokenizer_dir), text).chat_template


@pytest.mark.parametrize("name", [*BUILTIN, None])
def test_the_fast_renderer_equals_apply_chat_template(tok, name):
    """ChatRenderer binds the compiled template once; its output is apply_chat_template's, byte for byte, for every
    built-in template and ftune's default, with and without the generation prompt, on every prefix."""
    from ftune.datafiles.formats import DEFAULT_CHAT_TEMPLATE

    template = builtin(name) if name else DEFAULT_CHAT_TEMPLATE
    render = ChatRenderer(tok, template)
    for k in range(1, len(CONVERSATION) + 1):
        for gen in (False, True):
            assert render(CONVERSATION[:k], gen) == tok.apply_chat_template(
                CONVERSATION[:k], chat_template=template, tokenize=False, add_generation_prompt=gen)


def test_the_renderer_survives_pickling_for_worker_processes(tok):
    import pickle

    render = ChatRenderer(tok, builtin("chatml"))
    first = render(CONVERSATION[1:3], False)  # compiled now
    assert pickle.loads(pickle.dumps(render))(CONVERSATION[1:3], False) == first


def test_span_labels_walk_equals_the_bisect_reference():
    """The linear walk over tokens and spans labels exactly what a bisect per token labels (random cases)."""
    import random

    from ftune.datafiles.masking import _labels_by_bisect, labels_from_spans

    rng = random.Random(0)
    for _ in range(500):
        n = rng.randint(0, 40)
        cuts = sorted(rng.sample(range(1, 200), n)) if n else []
        offsets = [(a, b) for a, b in zip([0, *cuts], cuts)]
        offsets = [(a, a) if rng.random() < 0.05 else (a, b) for a, b in offsets]  # empty tokens too
        points = sorted(rng.sample(range(0, 210), 2 * rng.randint(0, 4)))
        spans = list(zip(points[::2], points[1::2]))
        ids = list(range(len(offsets)))
        assert labels_from_spans(ids, offsets, spans) == _labels_by_bisect(ids, offsets, spans)
    shuffled = [(5, 6), (0, 1), (2, 3)]  # out of order: the bisect decides
    assert labels_from_spans([1, 2, 3], shuffled, [(0, 4)]) == _labels_by_bisect([1, 2, 3], shuffled, [(0, 4)])


def test_span_labels_of_a_batch_equal_row_by_row():
    """The batched labelling (all rows in one sorted search) gives each row's labels exactly: random rows, empty
    rows and tokens, spans past the last token, offsets out of order, and spans out of order (the walk decides)."""
    import random

    from ftune.datafiles.masking import labels_from_spans, labels_from_spans_batch

    rng = random.Random(1)
    for _ in range(60):
        ids, offsets, spans = [], [], []
        for _ in range(rng.randint(1, 12)):
            n = rng.randint(0, 30)
            cuts = sorted(rng.sample(range(1, 120), n)) if n else []
            row = [(a, a) if rng.random() < 0.05 else (a, b) for a, b in zip([0, *cuts], cuts)]
            if rng.random() < 0.1:
                rng.shuffle(row)
            points = sorted(rng.sample(range(0, 130), 2 * rng.randint(0, 3)))
            offsets.append(row)
            spans.append(list(zip(points[::2], points[1::2])))
            ids.append([rng.randint(0, 99) for _ in row])
        want = [labels_from_spans(i, o, s) for i, o, s in zip(ids, offsets, spans)]
        assert labels_from_spans_batch(ids, offsets, spans) == want
    crossed = [[(8, 9), (2, 4)]]  # spans out of order
    assert labels_from_spans_batch([[7, 8, 9]], [[(0, 2), (2, 3), (8, 9)]], crossed) == \
        [labels_from_spans([7, 8, 9], [(0, 2), (2, 3), (8, 9)], crossed[0])]


def test_offsets_from_the_backend_equal_the_wrappers(tok):
    """encode_with_offsets calls the Rust backend directly; ids and offsets are the wrapper's, special tokens in
    the text included, and a backend left truncating sends it back through the wrapper."""
    from ftune.datafiles.formats import encode_with_offsets

    texts = ["<s>User: hi</s> the cat sat", "", "Assistant: 5 books \n\n read"]
    want = tok(texts, add_special_tokens=False, return_offsets_mapping=True)
    assert encode_with_offsets(tok, texts) == (want["input_ids"], [list(o) for o in want["offset_mapping"]])
    tok.backend_tokenizer.enable_truncation(2)
    try:
        ids, _ = encode_with_offsets(tok, texts)
        assert ids == want["input_ids"] and tok.backend_tokenizer.truncation is None  # the wrapper reset it
    finally:
        tok.backend_tokenizer.no_truncation()


def test_trainable_counts_targets_after_the_first_token():
    from ftune.datafiles.masking import IGNORE, trainable

    for labels in ([], [5], [IGNORE], [5, 6, IGNORE, 7], [IGNORE, IGNORE, 3], [IGNORE, 4, 5]):
        assert trainable(labels) == sum(1 for x in labels[1:] if x != IGNORE)


def test_anomaly_bits_in_one_pass_equal_the_named_anomalies():
    """The per-row bit mask (one pass) says what `chat_anomalies` says, on every short conversation of 4 roles."""
    from itertools import product

    from ftune.datafiles.chat_rows import ANOMALIES, anomaly_bits, chat_anomalies

    for n in range(5):
        for roles in product(("system", "user", "assistant", "tool"), repeat=n):
            for empty in range(n + 1):  # no empty message, or message `empty - 1` empty
                conv = [{"role": r, "content": "" if k == empty - 1 else "hi"} for k, r in enumerate(roles)]
                want = chat_anomalies(conv)
                assert anomaly_bits(conv) == sum(1 << k for k, kind in enumerate(ANOMALIES) if kind in want), conv
