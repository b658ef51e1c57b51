"""`ftune plan`'s cheap count of the local training data: rows, tokens through the chat template the data stage
uses, steps per epoch. Light: the standard library, pyarrow for Parquet, `tokenizers` for a local tokenizer."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from ftune import hub
from ftune.recipe.sources import sources


@dataclass(frozen=True)
class DataCount:
    samples: int
    """Training rows after limits and the eval split."""
    tokens: int | None
    """Tokens of those rows after truncation (None when the tokenizer is not local)."""
    rows: int | None
    """Rows the trainer iterates: samples, or packed sequences with packing (None: tokenizer not local)."""
    steps_per_epoch: int | None
    """None when packing and the tokenizer is not local (packed rows need token counts)."""
    total_steps: int | None
    """train.max_steps, else epochs x steps_per_epoch; None when neither is known."""
    epochs: float
    effective_batch: int
    approximate: bool
    """Tokens counted on a sample of rows, or packed rows derived from token counts."""
    longest: int | None = None
    """The longest tokenized row, before truncation (None when the tokenizer is not local): the plan's sequence
    length when data.max_seq_length is unset. Over the first MAX_TOKENIZED_ROWS rows of each source."""


MAX_TOKENIZED_ROWS = 20_000


def _rows(path: Path, kind: str) -> list | int | None:
    """The rows of a local file (a list, for token counting), or their count when only that is cheap."""
    suffix = path.suffix.lower()
    if kind == "json" or suffix in (".jsonl", ".json"):
        text = path.read_text(encoding="utf-8")
        if suffix == ".json" and text.lstrip().startswith("["):
            return json.loads(text)
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if kind == "csv" or suffix == ".csv":
        import csv

        with path.open(newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    if kind == "text" or suffix == ".txt":
        return [{"text": line} for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if kind == "parquet" or suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    return None


_SLICE = re.compile(r"^\s*(\w+)\s*(?:\[\s*(-?\d+)?\s*(%)?\s*:\s*(-?\d+)?\s*(%)?\s*\])?\s*$")


def split_rows(n: int, split: str) -> list[range] | None:
    """The row ranges a `datasets` split expression selects from a local file's n rows (a local file is the one
    split `train`): `train`, `train[:50%]`, `train[10:-10]`, `train[:10%]+train[-10%:]`, with datasets' rounding
    (closest). None when it names another split or isn't such an expression (the data stage reports that)."""
    out = []
    for part in split.split("+"):
        m = _SLICE.match(part)
        if m is None or m.group(1) != "train":
            return None
        bounds = []
        for value, pct, default in ((m.group(2), m.group(3), 0), (m.group(4), m.group(5), n)):
            if value is None:
                bounds.append(default)
                continue
            x = int(round(int(value) * n / 100.0)) if pct else int(value)
            bounds.append(max(n + x, 0) if x < 0 else min(x, n))
        out.append(range(bounds[0], bounds[1]))
    return out


def _row_text(row: dict, source) -> str:
    f = source.fields
    if source.format == "instruction":
        return " ".join(str(row.get(k) or "") for k in (f.instruction, f.input, f.output))
    if source.format in ("chat", "vision-chat"):
        return _messages_text(row.get(f.messages), f)
    if source.format in ("vision-preference", "vision-prompt"):  # the prompt and what is
        return " ".join(_messages_text(row.get(k), f) for k in (f.prompt, f.chosen))  # scored after it
    return str(row.get(f.text, ""))


def _messages_text(value, f) -> str:
    """The text of a string or of chat messages (a content string, or its text parts: image parts are counted
    by the image arithmetic, `ftune.estimate.vision_cost`)."""
    if isinstance(value, str) or not isinstance(value, list):
        return "" if value is None else str(value)
    out = []
    for m in value:
        content = m.get(f.content, "") if isinstance(m, dict) else ""
        out.append(" ".join(p.get("text") or "" for p in content if isinstance(p, dict)) if isinstance(content, list)
                   else str(content or ""))
    return " ".join(out)


def _conversation(row: dict, source) -> list[dict] | None:
    """A chat row (or an `as_chat` instruction row) as the data stage renders it; None for other formats or a row
    the data stage would refuse (counted as plain text then)."""
    f = source.fields
    if source.format == "instruction" and source.as_chat:
        ins, inp, out = (str(row.get(k) or "") for k in (f.instruction, f.input, f.output))
        user = source.template.format(instruction=ins, input=inp) if source.template else (
            f"{ins}\n\n{inp}" if inp.strip() else ins)
        return [{"role": "user", "content": user}, {"role": "assistant", "content": out}]
    if source.format != "chat":
        return None
    from ftune.datafiles.formats import DEFAULT_ROLE_MAP

    roles = {**DEFAULT_ROLE_MAP, **(source.roles or {})}
    messages = row.get(f.messages)
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return None
    return [{"role": roles.get(m.get(f.role), m.get(f.role)), "content": str(m.get(f.content) or "")}
            for m in messages]


def _chat_renderer(recipe, tokenizer_path: str):
    """conversation -> text through the chat template the data stage uses (data.chat_template, else the
    tokenizer's, else ftune's default); None when the tokenizer is not local."""
    if not (Path(tokenizer_path).expanduser() / "tokenizer_config.json").is_file():
        return None
    from transformers import AutoTokenizer

    from ftune.datafiles.chat_rows import ChatRenderer, chat_template_of

    hf = AutoTokenizer.from_pretrained(str(Path(tokenizer_path).expanduser()))
    renderer = ChatRenderer(hf, chat_template_of(recipe, hf))  # the data stage's renderer (apply_chat_template's text)

    def render(messages: list[dict]) -> str | None:
        try:
            return renderer(messages, False)
        except Exception:  # noqa: BLE001 - a row the template refuses: `ftune data` reports it; count its text
            return None

    return render


def _tokenizer(path: str):
    file = Path(path).expanduser() / "tokenizer.json"
    if not file.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(file))


def count_data(recipe, world_size: int, tokenizer_path: str, epochs: float) -> DataCount | None:
    """A cheap count of the local training data: rows, tokens (when the tokenizer is local), and steps.

    Chat rows (and `as_chat` instruction rows) are counted through the chat template, as the data stage renders
    them; plain instruction rows without their prompt template, a slight under-count. None when a source is not
    a local file.
    """
    data, train = recipe.data, recipe.train
    samples, tokens, approximate, longest = 0, 0, False, 0
    # a hub id counts with its cached snapshot's tokenizer (`hf download` on a login node, the job offline)
    tokenizer_path = str(hub.folder(tokenizer_path, recipe.model.revision, "tokenizer.json") or tokenizer_path)
    tok = _tokenizer(tokenizer_path)
    render = None
    for _, source in sources(recipe, splits=("train",)):
        path = Path(source.path).expanduser()
        if source.type in ("hub", "disk") or not path.is_file():
            return None
        rows = _rows(path, source.type)
        if rows is None:
            return None
        n = rows if isinstance(rows, int) else len(rows)
        ranges = split_rows(n, source.split)
        if ranges is None:
            return None
        if not isinstance(rows, int):
            rows = [rows[i] for r in ranges for i in r]
        n = sum(len(r) for r in ranges)
        n = min(n, source.limit) if source.limit else n
        samples += n
        if tok is None or isinstance(rows, int):
            tok = None
            continue
        subset = rows[: min(n, MAX_TOKENIZED_ROWS)]
        texts, special = [_row_text(r, source) for r in subset], True
        if source.format == "chat" or (source.format == "instruction" and source.as_chat):
            render = render if render is not None else _chat_renderer(recipe, tokenizer_path)
            rendered = [render(c) if render and (c := _conversation(r, source)) is not None else None
                        for r in subset]
            if all(t is not None for t in rendered):  # the template writes BOS/EOS itself
                texts, special = rendered, False
        lengths = [len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=special)]
        longest = max([longest, *lengths])
        if data.max_seq_length and not data.packing:
            lengths = [min(x, data.max_seq_length) for x in lengths]
        tokens += round(sum(lengths) * n / max(len(subset), 1))
        approximate |= len(subset) < n or (source.format == "instruction" and special)
    if data.eval is not None and not isinstance(data.eval, list):
        held_out = math.ceil(samples * data.eval.split)
        tokens = round(tokens * (samples - held_out) / samples) if samples else 0
        samples -= held_out
    ga = train.gradient_accumulation_steps
    rows_iterated: int | None = samples
    if data.packing and data.max_seq_length:
        rows_iterated = math.ceil(tokens / data.max_seq_length) if tok is not None else None
        approximate = True
    steps_per_epoch, total = None, train.max_steps
    if rows_iterated is not None:
        per_rank = math.ceil(rows_iterated / world_size)  # the distributed sampler pads to equal shards
        batches = math.ceil(per_rank / train.per_device_batch_size)
        steps_per_epoch = max(batches // ga + int(batches % ga > 0), 1)  # as transformers' Trainer counts
        total = train.max_steps or math.ceil(epochs * steps_per_epoch)
    return DataCount(samples, tokens if tok is not None else None, rows_iterated, steps_per_epoch, total, epochs,
                     train.per_device_batch_size * ga * world_size, approximate,
                     longest if tok is not None and longest else None)
