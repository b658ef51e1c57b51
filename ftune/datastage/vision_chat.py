"""`vision-chat` data: rows -> `input_ids`/`labels` with the image placeholders expanded by the model's processor,
the images' paths kept beside them; and the collator that turns a batch's images into the model's pixel inputs.

A row is rendered with the processor's chat template (or `data.chat_template`); the assistant turns are found as
for `chat` (`render_with_spans`), tokenized, then the processor expands each image placeholder into the image's
tokens (their number depends on the image's size). The labels follow the expansion: every inserted token, every
image token, the prompt and the padding are -100. Images are read through `ftune.datafiles.images` (checks, RGB,
resize), here and in the collator, so the pixels a batch sees are the ones the token count was computed from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ftune.datafiles.errors import DataError, row_location
from ftune.datafiles.formats import encode_with_offsets, render_with_spans
from ftune.datafiles.images import ImageProblem, open_image, parse_row, read_rows
from ftune.datafiles.masking import IGNORE, labels_from_spans, trainable
from ftune.datastage.packing import PaddingCollator
from ftune.datastage.report import DataReport, SourceReport, length_stats

BOOKKEEPING = ["_len", "_trainable", "_image_tokens", "_sizes"]


def image_token_ids(processor) -> set[int]:
    """The ids of the tokens that stand for image features (never trained, never cut)."""
    tok = processor.tokenizer
    found = set()
    for value in (getattr(processor, "image_token_id", None), getattr(tok, "image_token_id", None)):
        if isinstance(value, int):
            found.add(value)
    name = getattr(processor, "image_token", None)
    if isinstance(name, str):
        tid = tok.convert_tokens_to_ids(name)
        if isinstance(tid, int) and tid != tok.unk_token_id:
            found.add(tid)
    return found


def template_of(recipe, processor) -> str:
    """The chat template vision-chat rows are rendered with: `data.chat_template`, else the processor's."""
    from ftune.errors import FtuneError

    if recipe.data.chat_template:
        from ftune.datafiles.chat_rows import chat_template_of

        return chat_template_of(recipe, processor.tokenizer)
    template = getattr(processor, "chat_template", None) or getattr(processor.tokenizer, "chat_template", None)
    if not isinstance(template, str) or not template:
        raise FtuneError(f"the processor of {recipe.model.path} has no chat template: vision-chat rows are rendered "
                         "with it", hint="set data.chat_template to a Jinja template that renders image parts "
                         "(`{type: image}`) as the model's image placeholder")
    return template


def expand_labels(short: list[int], labels: list[int], long: list[int], images: set[int]) -> list[int] | None:
    """Labels for `long` (the processor's ids: image placeholders expanded) from those of `short` (the same text
    with each placeholder once): tokens of `short` keep their label, the tokens the expansion inserted get -100.
    A text token is matched only with the text up to the next image token (an expansion may hold a token that
    also follows the placeholder, e.g. a newline between image rows). None when the two can't be aligned."""
    out, i, n = [], 0, len(short)
    ahead = [0] * n  # text tokens from i up to the next image token (at most 4)
    run = 0
    for k in range(n - 1, -1, -1):
        run = 0 if short[k] in images else min(run + 1, 4)
        ahead[k] = run
    j, m = 0, len(long)
    while j < m:
        if i < n and long[j] == short[i] and (short[i] in images or long[j:j + ahead[i]] == short[i:i + ahead[i]]):
            out.append(labels[i])
            i += 1
        else:
            out.append(IGNORE)
        j += 1
    return out if i == n else None


@dataclass
class Settings:
    """What encoding a vision source needs besides its rows."""

    processor: object
    template: str
    images: object  # data.images
    max_len: int | None
    train_on: str
    max_images: int | None


def encode_source(src, rows: list[dict], order, s: Settings):
    """The encoded rows of `src` (in `order`) as a datasets.Dataset with bookkeeping columns, and the conversion
    notes. Raises DataError at the row (file:line) and field for anything that can't be trained on."""
    import datasets

    proc = s.processor
    tok = proc.tokenizer
    images_ids = image_token_ids(proc)
    base = Path(src.path).parent
    render = lambda msgs, gen: proc.apply_chat_template(msgs, chat_template=s.template, tokenize=False,  # noqa: E731
                                                         add_generation_prompt=gen)
    out: dict[str, list] = {"input_ids": [], "labels": [], "images": [], **{k: [] for k in BOOKKEEPING}}
    notes: set[str] = set()
    col = src.spec.fields.messages
    for r in order:
        r = int(r)

        def fail(message: str, hint: str | None = None, field: str | None = None) -> DataError:
            at = f", field {field}" if field else ""
            return DataError(f"{src.where}: row {r + 1} of {src.spec.path}{at}: {message}", hint=hint,
                             location=row_location(src.path, src.kind, r) if src.local else None)

        row = rows[r]
        try:
            parsed = parse_row(row.get(col) if isinstance(row, dict) else None, src, base)
            if s.max_images is not None and len(parsed.images) > s.max_images:
                raise ImageProblem(f"{len(parsed.images)} images, but the model takes at most {s.max_images} per "
                                   "sample", hint="split the row, or set data.images.max_per_sample where the model "
                                   "allows more", field=parsed.fields[s.max_images])
            pictures = []
            for path, at in zip(parsed.images, parsed.fields):
                image, found = open_image(path, s.images, at)
                pictures.append(image)
                notes.update(f"{src.where} row {r + 1}: {n}" for n in found)
        except ImageProblem as err:
            raise fail(err.message, err.hint, err.field) from None
        messages = [m if m["role"] != "assistant" or isinstance(m["content"], str) else
                    {"role": "assistant", "content": "".join(p["text"] for p in m["content"])}
                    for m in parsed.messages]
        try:
            text, spans = render_with_spans(render, messages)
        except Exception as err:  # noqa: BLE001 - jinja raise_exception(), bad role order, ...
            raise fail(f"the chat template rejected the conversation: {err}") from None
        (short,), (offsets,) = encode_with_offsets(tok, [text])
        short_labels = list(short) if s.train_on == "all" else labels_from_spans(short, offsets, spans)
        if pictures:
            try:
                enc = proc(text=[text], images=[pictures], add_special_tokens=False)
            except (ValueError, RuntimeError) as err:
                raise fail(f"the processor refused the row: {str(err).splitlines()[0]}",
                           hint="each image part must render as one image placeholder of the chat template") from None
            long = [int(t) for t in enc["input_ids"][0]]
            labels = expand_labels(list(short), short_labels, long, images_ids)
            if labels is None:
                raise fail("the processor's expansion of the image placeholders can't be aligned with the rendered "
                           "text", hint="report this with the model's name: ftune masks labels token by token")
        else:
            long, labels = list(short), short_labels
        labels = [IGNORE if t in images_ids else lab for t, lab in zip(long, labels)]
        n_image = sum(t in images_ids for t in long)
        if pictures and not n_image:
            raise fail(f"{len(pictures)} image(s), but the rendered text has no image token",
                       hint="the chat template must render `{type: image}` parts as the model's image placeholder")
        if s.max_len and len(long) > s.max_len and n_image:
            last = max(k for k, t in enumerate(long) if t in images_ids)
            if last >= s.max_len:
                raise fail(f"its image tokens run to token {last + 1}, beyond data.max_seq_length ({s.max_len}): "
                           "an image can't be cut", hint="raise data.max_seq_length, or lower data.images.max_pixels"
                           " (fewer tokens per image)")
        out["_len"].append(len(long))
        if s.max_len:
            long, labels = long[: s.max_len], labels[: s.max_len]
        out["input_ids"].append(long)
        out["labels"].append(labels)
        out["images"].append(parsed.images)
        out["_trainable"].append(trainable(labels))
        out["_image_tokens"].append(n_image)
        out["_sizes"].append([v for img in pictures for v in img.size])
    ints = datasets.List(datasets.Value("int32"))
    features = datasets.Features({"input_ids": ints, "labels": ints, "images": datasets.List(datasets.Value("string")),
                                  "_len": datasets.Value("int32"), "_trainable": datasets.Value("int32"),
                                  "_image_tokens": datasets.Value("int32"), "_sizes": ints})
    from ftune.datastage.pipeline import SOURCE_ROW

    encoded = datasets.Dataset.from_dict(out, features=features)
    return encoded.add_column(SOURCE_ROW, [int(r) for r in order]), sorted(notes)


def preprocess(recipe, processor, train_srcs, eval_srcs, template: str, scratch: Path, max_images: int | None,
               log=None) -> DataReport:
    """Build the vision-chat datasets into `scratch/train` (and `scratch/eval`); the report counts images too."""
    import numpy as np

    from ftune.datastage.arrow import numpy_columns
    from ftune.datastage.pipeline import _check_dropped, assemble

    data = recipe.data
    settings = Settings(processor, template, data.images, data.max_seq_length, data.train_on, max_images)
    report = DataReport(max_seq_length=data.max_seq_length)
    notes: list[str] = []

    def encode(src, _ds, seed):
        rows, order = source_rows(src, scratch, data.shuffle, seed)
        if log is not None:
            log(f"data: encoding {src.where} (vision-chat, {len(order):,} rows) ...")
        enc, found = encode_source(src, rows, order, settings)
        notes.extend(found)
        cols = numpy_columns(enc, ["_trainable", "_len"])
        keep, lens = cols["_trainable"] > 0, cols["_len"]
        rep = SourceReport(src.where, src.spec.path, "vision-chat", len(enc), int(keep.sum()), int((~keep).sum()),
                           int((lens > data.max_seq_length).sum()) if data.max_seq_length else 0)
        _check_dropped(src, rep, np.flatnonzero(~keep), order, data.max_dropped_fraction)
        if rep.dropped:
            enc = enc.select(np.flatnonzero(keep), keep_in_memory=True)
        return enc, rep

    train, evals = assemble(recipe, [(s, None) for s in train_srcs], eval_srcs, encode=encode, report=report)
    cols = numpy_columns(train, ["_len", "_trainable", "_image_tokens"])
    lengths = np.minimum(cols["_len"], data.max_seq_length) if data.max_seq_length else cols["_len"]
    return finish_images(scratch, report, train, evals, cols, lengths, notes, BOOKKEEPING)


def source_rows(src, scratch, shuffle: bool, seed: int):
    """An image source's rows (read directly, else through `datasets`) and the order they are encoded in: shuffled
    by the source's seed when `data.shuffle`, cut to the source's `limit`. Both image data stages read them so."""
    import numpy as np

    from ftune.datafiles.images import read_rows
    from ftune.datafiles.sources import load

    rows = read_rows(src)
    if rows is None:
        rows = list(load(src, scratch))
    order = np.random.default_rng(seed).permutation(len(rows)) if shuffle else np.arange(len(rows))
    if src.spec.limit:
        order = order[: src.spec.limit]
    return rows, order


def finish_images(scratch, report, train, evals, cols, lengths, notes: list[str], bookkeeping: list[str]):
    """The end of an image data stage (vision-chat rows here, vision-preference/-prompt rows in `vision_rows`): the
    report's counts (`lengths`: the train rows' token counts as trained) and images, the entry's splits saved
    without the `bookkeeping` columns."""
    from ftune.datastage.pipeline import finish_entry, split_origins

    report.train_samples, report.eval_samples = len(train), len(evals) if evals is not None else 0
    report.tokens, report.trainable_tokens = int(lengths.sum()), int(cols["_trainable"].sum())
    for k, v in length_stats(cols["_len"]).items():
        setattr(report, k, v)
    sizes = [tuple(row[k:k + 2]) for row in train["_sizes"] for k in range(0, len(row), 2)]
    by_area = sorted(sizes, key=lambda wh: (wh[0] * wh[1], wh))
    report.images = {"count": len(sizes), "rows": int(sum(1 for row in train["_sizes"] if row)),
                     "min_size": "x".join(map(str, by_area[0])) if sizes else "-",
                     "max_size": "x".join(map(str, by_area[-1])) if sizes else "-",
                     "tokens": int(cols["_image_tokens"].sum()), "all_tokens": report.tokens,
                     "notes": notes[:5] + ([f"... {len(notes) - 5} more"] if len(notes) > 5 else [])}
    train, evals = split_origins(scratch, train, evals)
    train.remove_columns(bookkeeping).save_to_disk(str(scratch / "train"))
    if evals is not None:
        evals.remove_columns(bookkeeping).save_to_disk(str(scratch / "eval"))
    finish_entry(scratch, report)
    return report


def first_rows(recipe, processor, n: int, max_images: int | None) -> tuple[list[dict], str]:
    """The first `n` rows of the eval sources (train sources when `data.eval` is a split) that the data stage would
    keep, read directly (`ftune.datafiles.sample.local_rows`) and encoded as it does: `input_ids` with the image
    placeholders expanded and the rows' image paths; and which rows they are (`eval`, `train`). For commands after
    training that need a handful of inputs (`ftune merge`'s check): never the whole data stage, whose cold cache
    would re-encode every row and image. A row the data stage would refuse or drop is passed over."""
    from ftune.datafiles.sample import local_rows

    settings = Settings(processor, template_of(recipe, processor), recipe.data.images, recipe.data.max_seq_length,
                        recipe.data.train_on, max_images)
    found: list[dict] = []
    split, peeked = local_rows(recipe, n)
    for src, rows in peeked:
        if len(found) >= n:
            break
        for r in range(len(rows)):  # one at a time: a bad row costs only itself
            try:
                enc, _ = encode_source(src, rows, [r], settings)
            except DataError:
                continue
            if enc[0]["_trainable"] > 0:
                found.append({"input_ids": list(enc[0]["input_ids"]), "images": list(enc[0]["images"])})
    return found[:n], split


def images_digest(srcs, settings) -> str:
    """sha256 over every image a vision-chat source names (path and content): part of the data cache key, so
    an image replaced under the same name re-encodes the data. Unreadable rows hash by their text: the encoder
    reports them."""
    import hashlib

    from ftune.datafiles.images import file_hash, parse_prompt

    digest = hashlib.sha256()
    for src in srcs:
        rows = read_rows(src) or []
        base = Path(src.path).parent
        for row in rows:
            try:
                paths = (parse_row(row.get(src.spec.fields.messages), src, base) if src.spec.format == "vision-chat"
                         else parse_prompt(row, src, base)).images
            except (ImageProblem, AttributeError):
                paths = []
            for path in paths:
                digest.update(path.encode())
                digest.update(file_hash(path).encode() if Path(path).is_file() else b"missing")
    return digest.hexdigest()


# -------------------------------------------------------------------------------------------- batches
@dataclass
class VisionCollator:
    """Pads a batch (input_ids with pad, labels -100, attention_mask 0) and adds the pixel inputs of its images,
    from the model's image processor (pixel_values, and image_grid_thw / pixel_attention_mask where the family
    has them). `mm_token_type_ids` (Qwen's M-RoPE) marks the image tokens where the processor returns it."""

    pad_token_id: int
    processor: object
    images: object  # data.images

    def __call__(self, features: list[dict]) -> dict:
        batch = PaddingCollator(self.pad_token_id)(features)
        ids = batch["input_ids"]
        batch.update(pixel_inputs(self.processor, [f.get("images") or [] for f in features], self.images, ids))
        return batch


def pixel_inputs(processor, paths: list[list[str]], settings, ids=None) -> dict:
    """The model's image inputs for a batch whose rows name `paths` (rows without images add nothing)."""
    import torch

    opened = [[open_image(p, settings)[0] for p in row] for row in paths]
    nested = [row for row in opened if row]
    out: dict = {}
    if nested:
        px = processor.image_processor(images=nested, return_tensors="pt")
        unused = set(getattr(processor, "unused_input_names", []))  # Gemma 3's num_crops: generate() refuses it
        out.update({k: v for k, v in px.items() if isinstance(v, torch.Tensor) and k not in unused})
        if ids is not None and "cross_attention_mask" in getattr(processor, "model_input_names", []):
            tiles = iter(px["num_tiles"])
            out["cross_attention_mask"] = cross_attention_mask(processor, ids, [next(tiles) if row else []
                                                                                for row in opened])
    key = type_ids_key(processor)
    if ids is not None and key:
        # the processor's own list where it has one (Gemma 3: the soft tokens, not <start_of_image>)
        found = {t for t in getattr(processor, "image_token_ids", None) or [] if isinstance(t, int)} or \
            image_token_ids(processor)
        out[key] = torch.isin(ids, torch.tensor(sorted(found))).to(torch.int) if found else \
            torch.zeros_like(ids, dtype=torch.int)
    return out


def cross_attention_mask(processor, ids, num_tiles: list[list[int]]):
    """Mllama's `cross_attention_mask` (batch, tokens, images, tiles): which of a row's tokens attend to which
    image's tiles (from each image token up to the next, the last to the row's end), as its processor builds it from
    the text, here from the batch's padded ids; `num_tiles`: the tiles of each row's images."""
    import torch
    from transformers.models.mllama.processing_mllama import (convert_sparse_cross_attention_mask_to_dense,
                                                              get_cross_attention_token_mask)

    sparse = [get_cross_attention_token_mask(row.tolist(), processor.image_token_id) for row in ids]
    dense = convert_sparse_cross_attention_mask_to_dense(sparse, num_tiles, processor.image_processor.max_image_tiles,
                                                         ids.shape[1])
    return torch.from_numpy(dense)


def type_ids_key(processor) -> str | None:
    """The input that marks a batch's image tokens, where the family's model reads one: Qwen-VL's
    `mm_token_type_ids` (M-RoPE positions), Gemma 3's `token_type_ids` (image tokens attend to each other both
    ways, as in pretraining). PaliGemma's `token_type_ids` mean prefix and suffix instead: not built here."""
    names = getattr(processor, "model_input_names", [])
    if "mm_token_type_ids" in names:
        return "mm_token_type_ids"
    if "token_type_ids" in names and getattr(processor, "return_mm_token_type_ids", False):
        return "token_type_ids"  # the processor renames its mm_token_type_ids so (Gemma 3, ShieldGemma 2)
    return None
