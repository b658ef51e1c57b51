"""Formats: how a row becomes `input_ids` and `labels` (text, instruction, chat, pretokenized, classification).

Each format is a batched encoder for `datasets.map`. Encoders add two bookkeeping columns, `_len`
(tokens before truncation) and `_trainable` (loss-bearing tokens), that the pipeline reads for its
report and drops. A row the recipe can't read raises `DataError` naming the file and row.
"""

from __future__ import annotations

import string
from itertools import repeat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ftune.errors import Location
from ftune.plugins import installed, load_object
from ftune.typed import not_text
from ftune.datafiles.chat_rows import (  # noqa: F401  (also read from here)
    ANOMALIES, DEFAULT_CHAT_TEMPLATE, DEFAULT_ROLE_MAP, ROLES, ChatRenderer, anomaly_bits, chat_anomalies,
    count_anomalies,
    normalize_messages,
)
from ftune.datafiles.errors import DataError, field_hint, first_bad_utf8, not_utf8, row_location
from ftune.datafiles.masking import (
    IGNORE,
    labels_from_spans_batch,
    prompt_completion_labels,
    trainable,
    truncate,
)
from ftune.datafiles.sources import Source
from ftune.datafiles.spans import render_with_spans  # noqa: F401  (also read from here)

ALPACA_TEMPLATE = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_TEMPLATE_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)
# Used when neither the recipe nor the tokenizer has a chat template. Every turn ends with eos_token,
# so a model trained on it learns to stop after its answer.
@dataclass(frozen=True)
class Context:
    """What every encoder needs besides the rows."""

    tokenizer: object
    max_len: int | None
    train_on: str
    chat_template: str
    label_names: list[str] | None = None
    num_labels: int | None = None

    @property
    def render(self) -> ChatRenderer:
        """The chat renderer for `chat_template` (one per context: the template is compiled once)."""
        cached = self.__dict__.get("_render")
        if cached is None:
            cached = ChatRenderer(self.tokenizer, self.chat_template)
            object.__setattr__(self, "_render", cached)
        return cached


def required_fields(src: Source) -> dict[str, str]:
    """Recipe key under `fields` -> column name the format needs in every row."""
    f = src.spec.fields
    plugged = installed().formats.get(src.spec.format)
    if plugged is not None:
        return {col: col for col in plugged.fields}
    return {
        "text": {"text": f.text},
        "instruction": {"instruction": f.instruction, "output": f.output},
        "chat": {"messages": f.messages},
        "pretokenized": {"input_ids": f.input_ids},
        "classification": {"text": f.text, "label": f.label},
        "preference": {"prompt": f.prompt, "chosen": f.chosen, "rejected": f.rejected},
        "unpaired-preference": {"prompt": f.prompt, "completion": f.completion, "label": f.label},
        "prompt": {"prompt": f.prompt},
        "vision-chat": {"messages": f.messages},
        "vision-preference": {"prompt": f.prompt, "chosen": f.chosen, "rejected": f.rejected},
        "vision-prompt": {"prompt": f.prompt},
    }[src.spec.format]


def check_columns(src: Source, columns: list[str], row: dict | None = None) -> None:
    """Raise for the first field the format needs that is not a column of the source (`row`: the first row, whose
    keys make the hint name the whole mapping)."""
    for key, col in required_fields(src).items():
        if col not in columns:
            raise DataError(
                f"{src.where}: " + ("this source sets no `format`, so it defaulted to text, which "
                                    if "format" not in src.spec.model_fields_set else f"{src.spec.format} data ")
                + f"needs field `{col}` (fields.{key}), "
                f"but row 1 of {src.spec.path} has: {', '.join(columns) or 'no fields'}",
                hint=field_hint(src.spec.format, columns, row),
                location=row_location(src.path, src.kind, 0) if src.local else None,
            )


def check_template(src: Source) -> None:
    if src.spec.template is None:
        return
    names = {name for _, name, _, _ in string.Formatter().parse(src.spec.template) if name is not None}
    unknown = names - {"instruction", "input"}
    if unknown:
        raise DataError(
            f"{src.where}.template: unknown placeholder(s) {', '.join(sorted(unknown))}",
            hint="the template may use {instruction} and {input}; write literal braces as {{ and }}",
        )


def encoder(src: Source, ctx: Context, rows) -> Callable[[dict, list[int]], dict]:
    """The batched `map` function for `src`; `rows[i]` is the source row of the i-th mapped row."""
    fmt = src.spec.format

    def fail(i: int, message: str, hint: str | None = None) -> DataError:
        at = rows[i]
        if isinstance(at, Location):  # a streamed row (ftune.datastage.stream): its file and line, as read
            line = f"line {at.line} of " if at.line else ""
            return DataError(f"{src.where}: {line}{at.file}: {message}", hint=hint, location=at)
        row = int(at)
        return DataError(
            f"{src.where}: row {row + 1} of {src.spec.path}: {message}",
            hint=hint,
            location=row_location(src.path, src.kind, row) if src.local else None,
        )

    plugged = installed().formats.get(fmt)
    plugin_encode = load_object(plugged.encode) if plugged is not None else None

    def encode(batch: dict, idx: list[int]) -> dict:
        try:
            return _encode(batch, idx)
        except UnicodeDecodeError as err:  # a loader that let bytes through: name the file's first bad line
            bad = first_bad_utf8(src.path) if src.local and Path(src.path).is_file() else None
            raise not_utf8(src, *(bad or (None, None, f"0x{err.object[err.start]:02x}"))) from None

    def _encode(batch: dict, idx: list[int]) -> dict:
        if fmt == "classification":
            return _classification(batch, idx, src, ctx, fail)
        anomalies: list[int] = []  # chat rows fill it as the generator below is consumed
        if plugin_encode is not None:
            pairs = _plugin(plugin_encode, batch, idx, ctx, fail)
        elif fmt == "text":
            pairs = _text(batch, idx, src, ctx, fail)
        elif fmt == "instruction":
            pairs = _instruction(batch, idx, src, ctx, fail)
        elif fmt == "chat":
            pairs = _chat(batch, idx, src, ctx, fail, anomalies)
        else:
            pairs = _pretokenized(batch, idx, src, ctx, fail)
        out: dict[str, list] = {"input_ids": [], "labels": [], "_len": [], "_trainable": []}
        for ids, labels, all_trained in pairs:  # all_trained: labels == ids, so counting is free
            out["_len"].append(len(ids))
            ids, labels = truncate(ids, labels, ctx.max_len)
            out["input_ids"].append(ids)
            out["labels"].append(labels)
            out["_trainable"].append(max(0, len(labels) - 1) if all_trained else trainable(labels))
        out["_anomalies"] = anomalies or [0] * len(out["input_ids"])
        return out

    return encode


def _plugin(encode, batch, idx, ctx, fail):
    """A plugin format: encode(row, tokenizer) -> (input_ids, labels) per row, checked like ours."""
    for n, i in enumerate(idx):
        row = {col: values[n] for col, values in batch.items()}
        try:
            ids, labels = encode(row, ctx.tokenizer)
        except Exception as err:  # noqa: BLE001 - the plugin's error, located at the row
            raise fail(i, f"the plugin format failed: {type(err).__name__}: {err}") from None
        if len(ids) != len(labels) or not all(isinstance(t, int) for t in ids):
            raise fail(i, "the plugin format returned input_ids and labels of different lengths or non-int ids")
        yield list(ids), list(labels), False


def _strings(batch: dict, col: str, idx: list[int], fail, *, optional: bool = False) -> list[str]:
    values = batch[col] if col in batch else [None] * len(idx)
    out = []
    for i, v in zip(idx, values):
        if v is None:
            if optional:
                v = ""
            else:
                raise fail(i, f"field `{col}` is empty (null)")
        if (wrong := not_text(v)) is not None:  # never trained as the string "[1, 2, 3]"
            raise fail(i, f"field `{col}` holds {wrong[0]}, not text", hint=wrong[1])
        out.append(v if isinstance(v, str) else str(v))
    return out


def _eos(ctx: Context) -> list[int]:
    eos = ctx.tokenizer.eos_token_id
    return [eos] if eos is not None else []


def _text(batch, idx, src, ctx, fail):
    texts = _strings(batch, src.spec.fields.text, idx, fail)
    eos = _eos(ctx)
    for ids in ctx.tokenizer(texts, add_special_tokens=True)["input_ids"]:
        if eos and (not ids or ids[-1] != eos[0]):
            ids = ids + eos
        yield ids, ids, True  # labels are the ids (never mutated: truncation slices)


def _instruction(batch, idx, src, ctx, fail):
    f = src.spec.fields
    instructions = _strings(batch, f.instruction, idx, fail)
    inputs = _strings(batch, f.input, idx, fail, optional=True)
    outputs = _strings(batch, f.output, idx, fail)
    if src.spec.as_chat:
        yield from _instruction_as_chat(idx, instructions, inputs, outputs, src, ctx, fail)
        return
    prompts = []
    for ins, inp in zip(instructions, inputs):
        template = src.spec.template or (ALPACA_TEMPLATE if inp.strip() else ALPACA_TEMPLATE_NO_INPUT)
        prompts.append(template.format(instruction=ins, input=inp))
    tok = ctx.tokenizer
    # The prompt is tokenized alone, as it will be at inference; the answer follows it.
    prompt_ids = tok(prompts, add_special_tokens=True)["input_ids"]
    answer_ids = tok(outputs, add_special_tokens=False)["input_ids"]
    eos = _eos(ctx)
    for p, a in zip(prompt_ids, answer_ids):
        labels = prompt_completion_labels(p, a + eos, ctx.train_on)
        yield p + a + eos, labels, ctx.train_on == "all"


def _instruction_as_chat(idx, instructions, inputs, outputs, src, ctx, fail):
    """Each row as a conversation: one user turn (the template filled in, else instruction then input) and one
    assistant turn (the output), rendered and masked exactly like `chat` rows."""
    conversations = []
    for ins, inp, out in zip(instructions, inputs, outputs):
        if src.spec.template:
            user = src.spec.template.format(instruction=ins, input=inp)
        else:
            user = f"{ins}\n\n{inp}" if inp.strip() else ins
        conversations.append([{"role": "user", "content": user}, {"role": "assistant", "content": out}])
    yield from _render_conversations(idx, conversations, ctx, fail)


def _chat(batch, idx, src, ctx, fail, anomalies: list[int]):
    conversations = [normalize_messages(m, src, i, fail) for i, m in zip(idx, batch[src.spec.fields.messages])]
    anomalies += [anomaly_bits(conv) for conv in conversations]
    yield from _render_conversations(idx, conversations, ctx, fail)


def _render_conversations(idx, conversations, ctx, fail):
    tok, render = ctx.tokenizer, ctx.render
    texts, spans = [], []
    for i, conv in zip(idx, conversations):
        try:
            text, sp = render_with_spans(render, conv)
        except Exception as err:  # jinja raise_exception(), bad role order, ...
            raise fail(i, f"the chat template rejected the conversation: {err}") from err
        texts.append(text)
        spans.append(sp)
    all_ids, offsets = encode_with_offsets(tok, texts)
    if ctx.train_on == "all":
        for ids in all_ids:
            yield ids, ids, True  # labels are the ids (never mutated: truncation slices)
        return
    yield from zip(all_ids, labels_from_spans_batch(all_ids, offsets, spans), repeat(False))


def encode_with_offsets(tok, texts: list[str]) -> tuple[list[list[int]], list[list[tuple[int, int]]]]:
    """Token ids and character offsets of `texts` (no special tokens added), as `tok(texts,
    return_offsets_mapping=True)` gives them. A fast tokenizer's Rust backend is called directly once the
    wrapper has left it with no truncation or padding (the wrapper's own call sets that): the wrapper's
    per-row conversion to Python dicts cost a fifth of a chat source's preprocessing."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None or backend.truncation is not None or backend.padding is not None or \
            backend.encode_special_tokens != bool(getattr(tok, "split_special_tokens", False)):
        enc = tok(texts, add_special_tokens=False, return_offsets_mapping=True)
        return enc["input_ids"], enc["offset_mapping"]
    encodings = backend.encode_batch(texts, add_special_tokens=False)
    return [e.ids for e in encodings], [e.offsets for e in encodings]


def _whole(values: list) -> list:
    """Token ids as ints. A file where one row holds a non-integer (2.5) is typed as floats by Arrow for every row,
    so a whole float (3.0) is read as its int; anything else (2.5, text, bool, None) is kept for the caller to name
    in its own row (before, the batch's first row was named, whatever its values)."""
    return [int(v) if isinstance(v, float) and v.is_integer() else v for v in values]


def _pretokenized(batch, idx, src, ctx, fail):
    """`pretokenized` (alias `tokens`) rows, checked before training: ids are token ids of this tokenizer, labels and
    the attention mask have one value per id, labels are ids or -100, the mask is 0/1 (its 0s, padding, dropped)."""
    f = src.spec.fields
    none = [None] * len(idx)
    all_labels, all_masks = batch.get(f.labels) or none, batch.get(f.attention_mask) or none
    vocab = len(ctx.tokenizer)
    retokenize = ("the ids were made with another tokenizer: re-tokenize the data with this model's tokenizer "
                  "(model.tokenizer / model.path)")
    for i, ids, labels, mask in zip(idx, batch[f.input_ids], all_labels, all_masks):
        if not isinstance(ids, list):
            raise fail(i, f"field `{f.input_ids}` must be a list of token ids")
        ids = _whole(ids)
        if (bad := next((t for t in ids if not isinstance(t, int) or isinstance(t, bool)), None)) is not None:
            raise fail(i, f"field `{f.input_ids}` holds {bad!r}, not a token id (a whole number)")
        if labels is not None and isinstance(labels, list):
            labels = _whole(labels)
        out_of_range = next((t for t in ids if t < 0 or t >= vocab), None)
        if out_of_range is not None:  # caught here: the embedding lookup would fail mid-run (or at the final eval)
            raise fail(i, f"token id {out_of_range} in `{f.input_ids}` is outside the tokenizer's vocabulary "
                       f"(0..{vocab - 1})", hint=retokenize)
        for col, values in ((f.labels, labels), (f.attention_mask, mask)):
            if values is not None and (not isinstance(values, list) or len(values) != len(ids)):
                got = f"{len(values)} values" if isinstance(values, list) else f"a {type(values).__name__}"
                raise fail(i, f"`{col}` has {got} but `{f.input_ids}` has {len(ids)}",
                           hint=f"`{col}` needs one value per token id")
        if mask is not None:
            wrong = [m for m in mask if m not in (0, 1) or isinstance(m, bool)]
            if wrong:
                raise fail(i, f"`{f.attention_mask}` holds {wrong[0]!r}: only 1 (a token) and 0 (padding) are allowed")
            if 0 in mask:
                keep = [k for k, m in enumerate(mask) if m]
                ids = [ids[k] for k in keep]
                labels = [labels[k] for k in keep] if labels is not None else None
        if labels is None or ctx.train_on == "all":
            yield list(ids), list(ids), True
            continue
        bad = next((x for x in labels if not (x is None or x == IGNORE or (isinstance(x, int) and not
                                                                            isinstance(x, bool) and 0 <= x < vocab))),
                   IGNORE)
        if bad != IGNORE:  # a target past the vocabulary fails the loss on the device, mid-run
            raise fail(i, f"label {bad!r} in `{f.labels}` is neither -100 nor a token id of the tokenizer "
                       f"(0..{vocab - 1})", hint=retokenize)
        yield list(ids), [IGNORE if x is None else int(x) for x in labels], False


def _classification(batch, idx, src, ctx, fail):
    f = src.spec.fields
    texts = _strings(batch, f.text, idx, fail)
    enc = ctx.tokenizer(texts, add_special_tokens=True)["input_ids"]
    out: dict[str, list] = {"input_ids": [], "attention_mask": [], "labels": [], "_len": [], "_trainable": []}
    names = ctx.label_names
    for i, text, ids, label in zip(idx, texts, enc, batch[f.label]):
        out["labels"].append(_label_id(label, names, ctx.num_labels, f.label, i, fail))
        out["_len"].append(len(ids))
        if ctx.max_len and len(ids) > ctx.max_len:
            # the tokenizer's own truncation keeps the special tokens it closes a sequence with (BERT's [SEP],
            # which its classifier was pretrained with); a plain cut would drop them
            ids = ctx.tokenizer(text, add_special_tokens=True, truncation=True, max_length=ctx.max_len)["input_ids"]
            ids = ids[: ctx.max_len]  # a max_len shorter than the special tokens themselves
        out["input_ids"].append(ids)
        out["attention_mask"].append([1] * len(ids))
        out["_trainable"].append(1)
    out["_anomalies"] = [0] * len(out["labels"])
    return out


def _label_id(label, names: list[str] | None, num_labels: int | None, col: str, i: int, fail) -> int:
    if isinstance(label, str) and names and label in names:
        return names.index(label)
    if isinstance(label, int) and not isinstance(label, bool):
        n = len(names) if names else num_labels
        if n is None or 0 <= label < n:
            return label
    if names:
        known = ", ".join(names)
    elif num_labels:
        known = f"ids 0..{num_labels - 1}"
    else:
        known = "(none: model.labels is not set and the labels mix names and ids)"
    raise fail(
        i,
        f"label {label!r} (field `{col}`) is not one of the label names: {known}",
        hint="add it to `model.labels` (in id order), or fix the row",
    )
