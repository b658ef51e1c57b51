"""Image rows for TRL's trainers: `vision-preference` (dpo) and `vision-prompt` (grpo) rows -> the columns TRL's
DPOTrainer and GRPOTrainer read, with each row's images as paths beside them.

A row's prompt is chat messages with image parts (or a string, its images listed in `fields.images`), read by
`ftune.datafiles.images.parse_prompt` and checked image by image as vision-chat rows are (located at the row and field).
- vision-preference -> {prompt, chosen, rejected, images}: the prompt rendered with the processor's chat template
  and its generation prompt (each image one placeholder, which TRL's DataCollatorForVisionPreference has the
  processor expand), each completion as the text the conversation adds after it (as `preference` rows).
- vision-prompt -> {prompt, images, answer?, _row}: the prompt as JSON messages, images as `{type: image}` parts
  (GRPO needs conversational prompts: it renders them with the processor and fills in the images).
The images stay paths: the trainer's side (`ftune.runtime.vision_trl`) opens them through `ftune.datafiles.images`, so
the pixels a batch sees are the ones counted here. `_len` counts the prompt's tokens after the processor expanded
its images (plus the chosen completion's), so the report and the plan's estimate see the real lengths.
"""

from __future__ import annotations

import json
from pathlib import Path

from ftune.datafiles.errors import DataError, row_location
from ftune.datafiles.images import ImageProblem, completion_text, open_image, parse_prompt
from ftune.datastage.report import DataReport, SourceReport
from ftune.datastage.vision_chat import finish_images, image_token_ids, source_rows

BOOKKEEPING = ["_len", "_trainable", "_truncated", "_image_tokens", "_sizes"]
ROW = "_row"  # as ftune.datastage.prompt.ROW: the source row a reward failed on


def _prompt_tokens(proc, text: str, pictures: list, fail) -> list[int]:
    """The prompt's ids as the model sees them: each image placeholder expanded by the processor."""
    if not pictures:
        return list(proc.tokenizer(text, add_special_tokens=False)["input_ids"])
    try:
        enc = proc(text=[text], images=[pictures], add_special_tokens=False)
    except (ValueError, RuntimeError) as err:
        raise fail(f"the processor refused the row: {str(err).splitlines()[0]}",
                   hint="each image part must render as one image placeholder of the chat template") from None
    return [int(t) for t in enc["input_ids"][0]]


def encode_source(src, rows: list, order, recipe, proc, template: str, max_images: int | None):
    """The encoded rows of `src` (in `order`) as a datasets.Dataset with bookkeeping columns, and the conversion
    notes. Raises DataError at the row (file:line) and field."""
    import datasets

    fmt = src.spec.format
    f = src.spec.fields
    data = recipe.data
    base = Path(src.path).parent
    image_ids = image_token_ids(proc)
    render = lambda msgs, gen: proc.apply_chat_template(msgs, chat_template=template, tokenize=False,  # noqa: E731
                                                         add_generation_prompt=gen)
    pref = fmt == "vision-preference"
    cols = ["prompt", "chosen", "rejected"] if pref else ["prompt", "answer", ROW]
    out: dict[str, list] = {c: [] for c in (*cols, "images", *BOOKKEEPING)}
    notes: set[str] = set()
    for r in order:
        r = int(r)

        def fail(message: str, hint: str | None = None, field: str | None = None) -> DataError:
            at = f", field {field}" if field else ""
            return DataError(f"{src.where}: row {r + 1} of {src.spec.path}{at}: {message}", hint=hint,
                             location=row_location(src.path, src.kind, r) if src.local else None)

        row = rows[r]
        try:
            parsed = parse_prompt(row, src, base)
            if max_images is not None and len(parsed.images) > max_images:
                raise ImageProblem(f"{len(parsed.images)} images, but the model takes at most {max_images} per "
                                   "sample", hint="split the row, or set data.images.max_per_sample where the model "
                                   "allows more", field=parsed.fields[max_images])
            pictures = []
            for path, at in zip(parsed.images, parsed.fields):
                image, found = open_image(path, data.images, at)
                pictures.append(image)
                notes.update(f"{src.where} row {r + 1}: {n}" for n in found)
            comps = [completion_text(row.get(c), src, c) for c in (f.chosen, f.rejected)] if pref else []
        except ImageProblem as err:
            raise fail(err.message, err.hint, err.field) from None
        try:
            head = render(parsed.messages, True)
            texts = []
            for c in comps:
                full = render(parsed.messages + [{"role": "assistant", "content": c}], False)
                if not full.startswith(head):
                    raise fail("the chat template renders the prompt differently once a completion follows it",
                               "use a prefix-stable chat template (data.chat_template)")
                texts.append(full[len(head):].rstrip())  # as `preference` rows: a trailing newline is no signal
        except DataError:
            raise
        except Exception as err:  # noqa: BLE001 - jinja raise_exception(), bad role order, ...
            raise fail(f"the chat template rejected the conversation: {err}") from None
        ids = _prompt_tokens(proc, head, pictures, fail)
        n_image = sum(t in image_ids for t in ids)
        if pictures and not n_image:
            raise fail(f"{len(pictures)} image(s), but the rendered prompt has no image token",
                       hint="the chat template must render `{type: image}` parts as the model's image placeholder")
        limit = min(x for x in (data.max_seq_length, data.max_prompt_length, 1 << 62) if x)
        if n_image and max(k for k, t in enumerate(ids) if t in image_ids) >= limit:
            raise fail(f"its prompt holds {len(ids)} tokens with its images expanded, and its image tokens run past "
                       f"{limit} (data.max_seq_length / data.max_prompt_length): an image can't be cut",
                       hint="raise data.max_seq_length (and data.max_prompt_length), or lower data.images.max_pixels")
        scored = len(proc.tokenizer(texts[0], add_special_tokens=False)["input_ids"]) if pref else 0
        out["prompt"].append(head if pref else json.dumps(_placeholders(parsed.messages)))
        if pref:
            out["chosen"].append(texts[0])
            out["rejected"].append(texts[1])
        else:
            answer = row.get(f.answer)
            if _answer_readers(recipe) and answer in (None, ""):
                raise fail(f"field `{f.answer}` is empty, and reward {', '.join(_answer_readers(recipe))} reads it")
            out["answer"].append(None if answer is None else str(answer))
            out[ROW].append(f"{src.where} row {r + 1} of {src.spec.path}")
        out["images"].append(parsed.images)
        out["_len"].append(len(ids) + scored)
        out["_trainable"].append(scored)
        out["_truncated"].append(bool(data.max_seq_length and len(ids) + scored > data.max_seq_length))
        out["_image_tokens"].append(n_image)
        out["_sizes"].append([v for img in pictures for v in img.size])
    ints = datasets.List(datasets.Value("int32"))
    text = datasets.Value("string")
    features = datasets.Features({**{c: text for c in out if c in cols}, "images": datasets.List(text),
                                  "_len": datasets.Value("int32"), "_trainable": datasets.Value("int32"),
                                  "_truncated": datasets.Value("bool"), "_image_tokens": datasets.Value("int32"),
                                  "_sizes": ints})
    from ftune.datastage.pipeline import SOURCE_ROW

    encoded = datasets.Dataset.from_dict(out, features=features)
    return encoded.add_column(SOURCE_ROW, [int(r) for r in order]), sorted(notes)


def _answer_readers(recipe) -> list[str]:
    from ftune.datafiles.check import answer_readers

    return answer_readers(recipe)


def _placeholders(messages: list[dict]) -> list[dict]:
    """Messages as GRPO takes them: every content a list of parts, each image part a bare `{type: image}` that
    TRL fills with the row's image, in order."""
    return [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}] if isinstance(m["content"], str)
             else [p if p["type"] == "text" else {"type": "image"} for p in m["content"]]} for m in messages]


def preprocess(recipe, processor, train_srcs, eval_srcs, template: str, scratch: Path, max_images: int | None,
               log=None) -> DataReport:
    """Build the vision-preference / vision-prompt datasets into `scratch/train` (and `scratch/eval`)."""
    from ftune.datastage.arrow import numpy_columns
    from ftune.datastage.pipeline import assemble

    data = recipe.data
    report = DataReport(max_seq_length=data.max_seq_length)
    notes: list[str] = []

    def encode(src, _ds, seed):
        rows, order = source_rows(src, scratch, data.shuffle, seed)
        if log is not None:
            log(f"data: encoding {src.where} ({src.spec.format}, {len(order):,} rows) ...")
        enc, found = encode_source(src, rows, order, recipe, processor, template, max_images)
        notes.extend(found)
        cut = int(numpy_columns(enc, ["_truncated"])["_truncated"].sum())
        return enc, SourceReport(src.where, src.spec.path, src.spec.format, len(enc), len(enc), 0, cut)

    train, evals = assemble(recipe, [(s, None) for s in train_srcs], eval_srcs, encode=encode, report=report)
    cols = numpy_columns(train, ["_len", "_trainable", "_image_tokens"])
    return finish_images(scratch, report, train, evals, cols, cols["_len"], notes, BOOKKEEPING)
