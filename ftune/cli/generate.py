"""`ftune generate RUN_DIR_OR_MODEL (--prompt TEXT | --file prompts.jsonl)`: batched generation with the run's
prompt format (instruction template or chat template) and stop tokens (EOS and end-of-turn).

Works on a run's final/ (an adapter, over a freshly quantized base for QLoRA, or a full model), a merged
folder, or any HF model folder. `--device-map auto` loads a model too big for one device with accelerate's
big-model inference (meta-device init, then load-and-dispatch; `--max-memory` caps each device).
A vision-language run's prompts carry images: `--image PATH` (shown with every prompt), or `--file` rows whose
messages hold image parts as its vision-chat data did (`ftune.infer.image_prompts`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ftune.errors import Location, UsageError


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments `generate` and `chat` share: what to load and how to decode."""
    p.add_argument("target", metavar="RUN_DIR_OR_MODEL",
                   help="a run dir, its recipe file, its final/, a merged folder, or an HF model folder")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default) decodes greedily")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, help="seed for sampling: the same seed gives the same text")
    p.add_argument("--device-map", choices=["auto"], help="spread the model over GPUs, CPU and disk (accelerate)")
    p.add_argument("--max-memory", action="append", default=[], metavar="DEVICE=SIZE",
                   help="memory cap per device for --device-map, e.g. 0=20GiB, cpu=64GiB (repeatable)")
    p.add_argument("--offload-dir", help="folder for weights that fit nowhere else (--device-map)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    src.add_argument("--file", help="jsonl of prompts: {prompt}, {instruction, input} or {messages} per line")
    p.add_argument("--image", action="append", default=[], metavar="PATH",
                   help="an image shown with every prompt, before its text (repeatable; a vision-language run)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--format", choices=["text", "json"], default="text")


def check_decoding(args: argparse.Namespace) -> None:
    if args.max_new_tokens <= 0:
        raise UsageError(f"--max-new-tokens must be > 0, got {args.max_new_tokens}")
    if args.temperature < 0:
        raise UsageError(f"--temperature must be >= 0, got {args.temperature}")
    if not 0 < args.top_p <= 1:
        raise UsageError(f"--top-p must be in (0, 1], got {args.top_p}")


def dispatch(args: argparse.Namespace) -> dict:
    from ftune.infer.load import dispatch_kwargs

    caps = {}
    for item in args.max_memory:
        device, eq, size = item.partition("=")
        if not eq or not size:
            raise UsageError(f"--max-memory {item!r}: expected DEVICE=SIZE, e.g. cpu=8GiB or 0=20GiB")
        caps[int(device) if device.isascii() and device.isdigit() else device] = size
    if (caps or args.offload_dir) and not args.device_map:
        raise UsageError("--max-memory and --offload-dir need --device-map auto")
    return dispatch_kwargs(args.device_map, caps or None, args.offload_dir)


def _check_prompt_row(row: dict, path: str, n: int, parts: bool = False) -> None:
    """Text where text is expected (a list would be stringified into the prompt), messages as {role, content}.
    `parts`: a vision-language run's rows, whose message content may be a list of text and image parts (read by
    `ftune.infer.image_prompts`, which names the field of a bad part)."""
    from ftune.typed import not_text

    where = Location(file=path, line=n)
    for key in ("prompt", "instruction", "input"):
        if key in row and (wrong := not_text(row[key])) is not None:
            raise UsageError(f"`{key}` holds {wrong[0]}, not text", hint=wrong[1], location=where)
    if "messages" in row:
        messages = row["messages"]
        if not isinstance(messages, list) or not messages:
            raise UsageError("`messages` must be a non-empty list of {role, content}", location=where)
        for k, m in enumerate(messages, 1):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
                raise UsageError(f"message {k} needs `role` (text) and `content`", location=where)
            if parts and isinstance(m["content"], list):
                continue
            if (wrong := not_text(m["content"])) is not None:
                hint = wrong[1] if parts else (f"{wrong[1]}; image parts need a vision-language run (model.task: "
                                               "image-text-to-text)")
                raise UsageError(f"message {k}'s `content` holds {wrong[0]}, not text", hint=hint,
                                 location=where)


def read_prompts(path: str, parts: bool = False) -> list[tuple[int, dict]]:
    """(line, row) of each prompt in a jsonl file; `parts`: message content may hold image parts."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"{path}: no such file", hint="--file takes a jsonl file, one prompt object per line")
    prompts = []
    for n, line in enumerate(file.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            raise UsageError(f"not valid JSON: {err.msg}", location=Location(file=path, line=n)) from None
        if isinstance(row, str):
            row = {"prompt": row}
        if not isinstance(row, dict) or not {"prompt", "instruction", "messages"} & set(row):
            raise UsageError("a prompt row needs `prompt`, `instruction` or `messages`",
                             location=Location(file=path, line=n))
        _check_prompt_row(row, path, n, parts)
        prompts.append((n, row))
    if not prompts:
        raise UsageError(f"{path} holds no prompts")
    return prompts


def image_prompts(target, rows: list[tuple[int | None, object]], images: list[str], file: str | None) -> list:
    """A vision-language run's prompts (`ftune.infer.image_prompts.ImagePrompt`), their images checked: a row's bad image
    part is a usage error at the row and field (`row 2 of rows.jsonl, field messages[0].content[1].image`), as the
    data stage names it; `images` (--image) are shown with every prompt."""
    from ftune.datafiles.images import ImageProblem
    from ftune.infer.image_prompts import as_messages, check_images, image_prompt, settings_of

    settings, limit = settings_of(target)
    shown = check_images(images, settings)
    base = Path(file).resolve().parent if file is not None else Path.cwd()
    out = []
    for k, (line, row) in enumerate(rows, 1):
        try:
            out.append(image_prompt(as_messages(row, shown), base, settings, limit))
        except ImageProblem as err:
            if file is None:
                raise UsageError(f"--prompt {k}: {err.message}", hint=err.hint) from None
            raise UsageError(f"row {k} of {file}, field {err.field}: {err.message}", hint=err.hint,
                             location=Location(file=file, line=line)) from None
    return out


def run(args: argparse.Namespace) -> int:
    import sys

    from ftune.infer.load import clamp_new_tokens, load_for_generation
    from ftune.infer.source import resolve
    from ftune.generation import encode_prompt, generate

    check_decoding(args)
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {args.batch_size}")
    extra = dispatch(args)
    # the file first (its errors don't depend on the model); image parts are checked once the target says what
    # reads them
    rows = read_prompts(args.file, parts=True) if args.file is not None else [(None, p) for p in args.prompt or []]
    target = resolve(args.target, allow_model=True)
    from ftune.infer.image_prompts import NEEDS_VLM_HINT, is_vision

    vision = is_vision(target)
    if args.image and not vision:
        raise UsageError("--image needs a vision-language run (model.task: image-text-to-text)", hint=NEEDS_VLM_HINT)
    if args.file is not None and not vision:
        for line, row in rows:
            _check_prompt_row(row, args.file, line)
    prompts = [row for _, row in rows]
    shown = image_prompts(target, rows, args.image, args.file) if vision else None  # checked before loading
    lo = load_for_generation(target, extra=extra)
    images, pixels = None, None
    if shown is not None:
        encoded = [lo.vision.encode(p) for p in shown]
        images, pixels = [p.images for p in shown], lo.vision.pixels
    else:
        encoded = [encode_prompt(lo.fmt, lo.tokenizer, p) for p in prompts]
    max_new, note = clamp_new_tokens(lo.model, max(len(e) for e in encoded), args.max_new_tokens)
    if note:
        print(note, file=sys.stderr)
    completions = generate(lo.model, lo.tokenizer, encoded, stop_ids=lo.stop_ids, max_new_tokens=max_new,
                           temperature=args.temperature, top_p=args.top_p, seed=args.seed, batch_size=args.batch_size,
                           images=images, pixels=pixels)
    if args.format == "json":
        results = [{"prompt": p, "completion": c.text, "tokens": len(c.ids),
                    "finish_reason": "stop" if c.stopped else "length"} for p, c in zip(prompts, completions)]
        print(json.dumps({"model": lo.description, "prompt_format": lo.fmt.format, "stop_token_ids": lo.stop_ids,
                          "results": results}, indent=2, ensure_ascii=False))
        return 0
    for p, c in zip(prompts, completions):
        if len(prompts) > 1:
            print(f"### {p if isinstance(p, str) else json.dumps(p, ensure_ascii=False)}")
        print(c.text)
    return 0
