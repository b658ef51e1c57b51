"""`ftune merge`'s check on a vision run samples its first rows read directly (`ftune.datastage.vision_chat.first_rows`),
as the text runs' check does (`ftune.datafiles.sample.first_rows`): encoded row by row as the data stage encodes them,
with their images, never through the whole data stage; a row the data stage would refuse is passed over, and
the eval sources are preferred to the train sources (#40)."""

from __future__ import annotations

import numpy as np

from ftune.recipe.schema import Recipe

from tests.unit.test_vision_data import _encode, _jsonl, _png, _row, processor  # noqa: F401


def _recipe(train, **data) -> Recipe:
    return Recipe.model_validate({"name": "v", "model": {"path": "m", "task": "image-text-to-text"},
                                  "data": {"train": [{"path": str(train), "format": "vision-chat"}],
                                           "max_seq_length": 64, **data}, "train": {"max_steps": 1}})


def test_first_rows_are_read_directly_and_encoded_as_the_data_stage_does(processor, tmp_path, monkeypatch):  # noqa: F811
    from ftune import datastage as dataset
    from ftune.datastage.vision_chat import first_rows

    monkeypatch.setattr(dataset, "build", lambda *a, **k: (_ for _ in ()).throw(AssertionError("data stage built")))
    for name in ("a", "b", "c"):
        _png(tmp_path / f"{name}.png")
    image = lambda name: {"type": "image", "image": f"{name}.png"}  # noqa: E731
    rows = [_row(image("gone"), {"type": "text", "text": "a missing image"}),  # refused by the data stage
            _row(image("a"), {"type": "text", "text": "what colour"}),
            {"messages": [{"role": "user", "content": "no image here"}, {"role": "assistant", "content": "ok"}]},
            _row(image("b"), {"type": "text", "text": "and this"}, answer="blue"),
            _row(image("c"), {"type": "text", "text": "never read"})]
    path = _jsonl(tmp_path / "train.jsonl", rows)
    found, split = first_rows(_recipe(path), processor, 4, max_images=1)  # reads rows 1-4 only
    assert split == "train" and [r["images"] for r in found] == [[str(tmp_path / "a.png")], [], [str(tmp_path / "b.png")]]
    # the same ids as the data stage's encoder gives those rows (placeholders expanded: 4 image tokens each)
    whole, _ = _encode(processor, _jsonl(tmp_path / "rest.jsonl", rows[1:4]), max_len=64)
    assert [r["input_ids"] for r in found] == whole["input_ids"]
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    assert [np.sum(np.array(r["input_ids"]) == image_id) for r in found] == [4, 0, 4]

    held = _jsonl(tmp_path / "held.jsonl", [rows[3]])
    found, split = first_rows(_recipe(path, eval=[{"path": str(held), "format": "vision-chat"}]), processor, 4,
                              max_images=1)
    assert split == "eval" and [r["images"] for r in found] == [[str(tmp_path / "b.png")]]
