"""The first few rows of a run's data, read directly and tokenized as its data stage does: for the commands after
training that need a handful of inputs (`ftune merge`'s check), never the whole data stage (which would
re-preprocess every row on a cold cache). A vision run's rows, with their images, are encoded from `local_rows` by
`ftune.datastage.vision_chat.first_rows` (the processor's expansion lives there)."""

from __future__ import annotations

from ftune.datafiles.errors import DataError
from ftune.datafiles.sources import peek, resolve
from ftune.recipe.sources import sources

TEXT_COLUMNS = ("prompt", "chosen", "completion", "answer")
"""Rows the run leaves untokenized (TRL tokenizes preference and prompt rows itself): their text, in this order."""


def row_ids(row: dict, tokenizer) -> list[int]:
    """A row's token ids: its `input_ids`, else its text columns tokenized ([] when it has no text)."""
    if "input_ids" in row:
        return list(row["input_ids"])
    text = "".join(row[k] for k in TEXT_COLUMNS if isinstance(row.get(k), str))
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def first_rows(recipe, tokenizer, n: int, rows_kind: str = "sft") -> tuple[list[list[int]], str]:
    """Token ids of the first `n` rows of the eval sources (the train sources when `data.eval` is a split or
    absent), encoded by the format's encoder with the run's chat template (`rows_kind` `sft`, `Plan.data.rows`),
    or the row's text columns tokenized (preference and prompt rows, which TRL tokenizes); and which rows they are
    (`eval`, `train`). ([], reason) when no local row can be read: hub data, a missing file."""
    found: list[list[int]] = []
    split, peeked = local_rows(recipe, n)
    for src, rows in peeked:
        if len(found) >= n:
            break
        found += (_encoded(src, rows, recipe, tokenizer) if rows_kind == "sft"
                  else [row_ids(r, tokenizer) for r in rows])
    return [ids for ids in found if ids][:n], split


def local_rows(recipe, n: int):
    """(`eval` or `train`, an iterator of (source, its first `n` rows)) over the local sources a check samples: the
    eval sources, else the train sources (`data.eval` a split or absent). Hub sources and unreadable files are
    passed over; rows are read only as the caller asks for the next source."""
    evals = list(sources(recipe, splits=("eval",)))
    split, picked = ("eval", evals) if evals else ("train", list(sources(recipe, splits=("train",))))

    def rows():
        for where, spec in picked:
            if spec.type == "hub":
                continue
            try:
                src = resolve(spec, where)
                peeked = peek(src, n) if src.local else None
            except (DataError, OSError):
                continue
            if peeked and peeked[1]:
                yield src, peeked[1]

    return split, rows()


def _encoded(src, rows: list[dict], recipe, tokenizer) -> list[list[int]]:
    from ftune.datafiles.chat_rows import chat_template_of
    from ftune.datafiles.formats import Context, encoder

    ctx = Context(tokenizer, recipe.data.max_seq_length, recipe.data.train_on, chat_template_of(recipe, tokenizer),
                  recipe.model.labels, recipe.model.num_labels)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    batch = {c: [r.get(c) for r in rows] for c in columns}
    try:
        return encoder(src, ctx, list(range(len(rows))))(batch, list(range(len(rows))))["input_ids"]
    except DataError:  # a row the data stage would drop or refuse: the check uses the others' text
        return []
