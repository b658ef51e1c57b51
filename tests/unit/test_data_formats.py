"""Formats and loss masking: which tokens each format trains, checked by decoding the labels."""

from __future__ import annotations

import json

import pytest

from ftune.recipe.schema import Recipe
from tests.data_stage import build
from ftune.datafiles.formats import DEFAULT_CHAT_TEMPLATE

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(tok, tmp_path, rows, source=None, task=None, labels=None, **data):
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    model = {"path": "unused", **({"task": task} if task else {}), **({"labels": labels} if labels else {})}
    recipe = Recipe.model_validate({
        "name": "t", "model": model,
        "data": {"train": [{"path": str(path), **(source or {})}], "shuffle": False,
                 "cache_dir": str(tmp_path / "cache"), **data},
    })
    return build(recipe, tok, log=lambda _: None)


def trained(tok, row) -> str:
    """The text of the tokens that carry loss (the first token never does: the loss is shifted)."""
    return tok.decode([t for t, lab in zip(row["input_ids"][1:], row["labels"][1:]) if lab != -100])


def test_text_trains_every_token_and_appends_eos(tok, tmp_path):
    b = run(tok, tmp_path, [{"text": "the cat sat"}, {"text": "a dog ran in the park"}])
    row = b.train[0]
    assert row["input_ids"] == row["labels"]
    assert row["input_ids"][-1] == tok.eos_token_id
    assert tok.decode(row["input_ids"]) == "the cat sat</s>"
    assert b.report.tokens == sum(len(r) for r in b.train["input_ids"])
    assert b.report.trainable_tokens == b.report.tokens - 2  # each sample's first token is never a target


def test_instruction_trains_only_the_response_with_the_alpaca_template(tok, tmp_path):
    rows = [{"instruction": "add 2 and 3", "input": "", "output": "5"},
            {"instruction": "add", "input": "4 and 4", "output": "8"}]
    b = run(tok, tmp_path, rows, {"format": "instruction"})
    first, second = b.train[0], b.train[1]
    assert trained(tok, first) == "5</s>"
    assert trained(tok, second) == "8</s>"
    assert "### Instruction:\nadd 2 and 3\n\n### Response:\n" in tok.decode(first["input_ids"])
    assert "### Input:\n4 and 4" in tok.decode(second["input_ids"])
    assert "### Input:" not in tok.decode(first["input_ids"])


def test_instruction_custom_template_and_train_on_all(tok, tmp_path):
    rows = [{"q": "add 1 and 1", "a": "2"}]
    src = {"format": "instruction", "template": "Q: {instruction}\nA: ", "fields": {"instruction": "q", "output": "a"}}
    b = run(tok, tmp_path, rows, src, train_on="all")
    row = b.train[0]
    assert tok.decode(row["input_ids"]) == "Q: add 1 and 1\nA: 2</s>"
    assert row["labels"] == row["input_ids"]


def sharegpt(i):
    return {"conversations": [
        {"from": "system", "value": "be brief"},
        {"from": "human", "value": f"first question {i}"},
        {"from": "gpt", "value": f"first answer {i}"},
        {"from": "human", "value": "second question"},
        {"from": "gpt", "value": "second answer"},
    ]}


SHAREGPT = {"format": "chat", "fields": {"messages": "conversations", "role": "from", "content": "value"}}


def test_chat_trains_every_assistant_turn_with_the_default_template(tok, tmp_path):
    assert tok.chat_template is None
    b = run(tok, tmp_path, [sharegpt(1)], SHAREGPT)
    row = b.train[0]
    text = tok.decode(row["input_ids"])
    assert text.startswith("<|system|>\nbe brief</s>\n<|user|>\nfirst question 1</s>\n<|assistant|>\n")
    assert trained(tok, row) == "first answer 1</s>second answer</s>"


def test_chat_uses_the_tokenizers_template_and_the_recipe_override(tok, tmp_path):
    own = tok.__class__.from_pretrained(tok.name_or_path)
    own.chat_template = CHATML
    b = run(own, tmp_path, [sharegpt(2)], SHAREGPT)
    row = b.train[0]
    assert tok.decode(row["input_ids"]).startswith("<|im_start|>system\nbe brief<|im_end|>")
    assert trained(tok, row) == "first answer 2<|im_end|>second answer<|im_end|>"
    b = run(own, tmp_path, [sharegpt(2)], SHAREGPT, chat_template=DEFAULT_CHAT_TEMPLATE)
    assert trained(tok, b.train[0]) == "first answer 2</s>second answer</s>"


def test_chat_train_on_all_and_custom_roles(tok, tmp_path):
    rows = [{"messages": [{"role": "customer", "content": "hi"}, {"role": "agent", "content": "hello"}]}]
    src = {"format": "chat", "roles": {"customer": "user", "agent": "assistant"}}
    b = run(tok, tmp_path, rows, src)
    assert trained(tok, b.train[0]) == "hello</s>"
    b = run(tok, tmp_path, rows, src, train_on="all")
    assert b.train[0]["labels"] == b.train[0]["input_ids"]


def test_pretokenized_keeps_given_labels_or_trains_all(tok, tmp_path):
    rows = [{"input_ids": [5, 6, 7, 8], "labels": [-100, -100, 7, 8]}, {"input_ids": [9, 10, 11], "labels": None}]
    b = run(tok, tmp_path, rows, {"format": "pretokenized"})
    assert b.train[0]["labels"] == [-100, -100, 7, 8]
    assert b.train[1]["labels"] == [9, 10, 11]


def test_classification_maps_label_names_to_ids(tok, tmp_path):
    rows = [{"text": "good cat", "label": "positive"}, {"text": "bad dog", "label": "negative"},
            {"text": "ok", "label": 1}]
    b = run(tok, tmp_path, rows, {"format": "classification"}, task="sequence-classification",
            labels=["negative", "positive"], max_seq_length=8)
    assert b.train["labels"] == [1, 0, 1]
    assert b.label_names == ["negative", "positive"]
    assert set(b.train.column_names) == {"input_ids", "attention_mask", "labels"}
    batch = b.collator([b.train[0], b.train[2]])
    assert batch["labels"].tolist() == [1, 1]
    assert batch["attention_mask"].sum(1).tolist() == [len(b.train[0]["input_ids"]), len(b.train[2]["input_ids"])]


def test_classification_infers_label_names_when_the_recipe_has_none(tok, tmp_path):
    rows = [{"text": "a", "label": "spam"}, {"text": "b", "label": "ham"}, {"text": "c", "label": "spam"}]
    b = run(tok, tmp_path, rows, {"format": "classification"}, task="sequence-classification")
    assert b.label_names == ["ham", "spam"]
    assert b.train["labels"] == [1, 0, 1]


def test_truncation_is_counted_and_prompt_only_samples_are_dropped(tok, tmp_path):
    long_prompt = " ".join(["the cat sat on a mat"] * 10)
    rows = [{"instruction": long_prompt, "input": "", "output": "yes"}] + [
        {"instruction": "hi", "input": "", "output": "the dog ran in the park while birds sang songs about rain"}
        for _ in range(4)
    ]
    src = {"format": "instruction", "template": "{instruction}\n"}
    b = run(tok, tmp_path, rows, src, max_seq_length=12, max_dropped_fraction=0.25)
    rep = b.report
    assert (rep.rows, rep.kept, rep.dropped) == (5, 4, 1)
    assert rep.truncated == 5  # every row is longer than 12 tokens
    assert all(len(ids) == 12 for ids in b.train["input_ids"])
    assert rep.length_max > 12 and rep.histogram[-1][2] >= 1
    # The answer is cut: what survives of it is trained, and the eos is gone with the tail.
    assert trained(tok, b.train[0]) and "</s>" not in trained(tok, b.train[0])


def test_classification_truncation_keeps_the_closing_special_token(tmp_path):
    """A BERT-style tokenizer ([CLS] text [SEP]): a cut row still ends with [SEP], as the tokenizer's own
    truncation gives (the classifier was pretrained on sequences that end so)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "sat", "on", "a", "mat"]
    raw = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    bert = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                   sep_token="[SEP]")
    rows = [{"text": "the cat sat on a mat the cat sat", "label": 1}, {"text": "a cat", "label": 0}]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    recipe = Recipe.model_validate({"name": "t", "model": {"path": "unused", "task": "sequence-classification",
                                                           "num_labels": 2},
                                    "data": {"train": [{"path": str(path), "format": "classification"}],
                                             "shuffle": False, "cache_dir": str(tmp_path / "cache"),
                                             "max_seq_length": 6}})
    b = build(recipe, bert, log=lambda _: None)
    assert b.train[0]["input_ids"] == [2, 4, 5, 6, 7, 3]  # [CLS] the cat sat on [SEP]
    assert b.train[1]["input_ids"] == [2, 8, 5, 3]  # not cut: as encoded
    assert b.report.truncated == 1


def test_tokens_rows_pass_through_with_labels_and_their_attention_mask(tok, tmp_path):
    """`format: tokens` (= pretokenized): ids and labels kept as given, the padding under a mask's 0s dropped (ftune
    pads itself), -100 labels never trained; a row without labels trains every token."""
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    rows = [{"input_ids": [5, 6, 7, 8, pad, pad], "labels": [-100, -100, 7, 8, -100, -100],
             "attention_mask": [1, 1, 1, 1, 0, 0]},
            {"input_ids": [9, 10, 11], "attention_mask": [1, 1, 1]}]
    b = run(tok, tmp_path, rows, {"format": "tokens"})
    assert b.train["input_ids"] == [[5, 6, 7, 8], [9, 10, 11]]
    assert b.train["labels"] == [[-100, -100, 7, 8], [9, 10, 11]]
    assert set(b.train.column_names) == {"input_ids", "labels"}
    assert b.report.tokens == 7 and b.report.trainable_tokens == 2 + 2  # row 1: 7, 8; row 2: 10, 11 (shifted)
