"""`vision-chat` rows: messages whose content is text or a list of parts `{type: text|image}`, and the images
they name, read the one way every user of them reads them (the data stage, the collator, generation, `ftune data`).

An image is a path relative to the data file (or absolute). It is opened with PIL, checked (exists, is an image,
not truncated, within `data.images` after resizing), converted to RGB (CMYK and 16-bit images too, with a note)
and resized into [min_pixels, max_pixels] (`resize: fit`). Problems are `ImageProblem`s that the callers locate
at the row and field (`messages[0].content[1].image`). PIL is imported inside the functions; no torch here.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ftune.datafiles.chat_rows import DEFAULT_ROLE_MAP, ROLES
from ftune.typed import not_text

IMAGE_KEYS = ("image", "path", "url")
"""Where an image part names its file (`{type: image, image: cat.png}`; `path` and `url` are read the same)."""


class ImageProblem(Exception):
    """A row's image that can't be used: the message, a hint, and the field (`messages[0].content[1].image`)."""

    def __init__(self, message: str, hint: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.message, self.hint, self.field = message, hint, field


@dataclass
class VisionRow:
    """A vision-chat row as the template renders it: messages with image parts as `{type: image}` (in order), the
    images' absolute paths, and the field each came from."""

    messages: list[dict]
    images: list[str] = field(default_factory=list)
    fields: list[str] = field(default_factory=list)


def parse_row(messages, src, base: Path) -> VisionRow:
    """One row's messages (the source's role map applied) -> a VisionRow; raises ImageProblem naming the field."""
    f = src.spec.fields
    mapping = {**DEFAULT_ROLE_MAP, **(src.spec.roles or {})}
    if not isinstance(messages, list):
        raise ImageProblem(f"field `{f.messages}` must be a list of messages, got {type(messages).__name__}",
                           field=f.messages)
    row = VisionRow([])
    for k, m in enumerate(messages):
        where = f"{f.messages}[{k}]"
        if not isinstance(m, dict) or f.role not in m or f.content not in m:
            raise ImageProblem(f"message {k + 1} needs keys `{f.role}` and `{f.content}`", field=where)
        role = mapping.get(m[f.role]) if isinstance(m[f.role], str) else None
        if role not in ROLES:
            raise ImageProblem(f"message {k + 1} has unknown role {m[f.role]!r} (known: {', '.join(sorted(mapping))})",
                               hint=f"map it in the source, e.g. `roles: {{{m[f.role]}: assistant}}`",
                               field=f"{where}.{f.role}")
        content = m[f.content]
        if content is None or isinstance(content, str):
            row.messages.append({"role": role, "content": content or ""})
            continue
        if not isinstance(content, list):
            raise ImageProblem(f"message {k + 1}'s `{f.content}` must be text or a list of parts, got "
                               f"{type(content).__name__}", field=f"{where}.{f.content}")
        parts = []
        for j, part in enumerate(content):
            at = f"{where}.{f.content}[{j}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                text = part.get("text")
                if (wrong := not_text(text)) is not None or not isinstance(text, str):
                    raise ImageProblem(f"a text part needs a string `text`, got {wrong[0] if wrong else text!r}",
                                       field=f"{at}.text")
                parts.append({"type": "text", "text": text})
            elif kind == "image":
                key = next((x for x in IMAGE_KEYS if part.get(x)), None)
                if key is None or not isinstance(part[key], str):
                    raise ImageProblem("an image part needs `image`: the image file's path (relative to the data "
                                       "file)", field=f"{at}.image")
                if role == "assistant":
                    raise ImageProblem("an assistant message carries an image: models generate text only",
                                       hint="put images in user (or system) messages", field=f"{at}.{key}")
                row.images.append(_resolve(part[key], base, f"{at}.{key}"))
                row.fields.append(f"{at}.{key}")
                parts.append({"type": "image"})
            else:
                raise ImageProblem(f"a content part needs `type: text` or `type: image`, got {kind!r}",
                                   field=f"{at}.type")
        row.messages.append({"role": role, "content": parts})
    return row


def parse_prompt(row, src, base: Path) -> VisionRow:
    """A `vision-preference` / `vision-prompt` row's prompt -> a VisionRow. The prompt is chat messages whose image
    parts name their files (as in vision-chat), or a string (one user message). A list of paths in the row's
    `fields.images` column fills `{type: image}` parts that name no file, in order; after a string prompt, its
    images come before the text (as TRL places them). Raises ImageProblem naming the field."""
    f = src.spec.fields
    if not isinstance(row, dict):
        raise ImageProblem(f"a row must be an object with `{f.prompt}`, got {type(row).__name__}")
    prompt, listed = row.get(f.prompt), row.get(f.images)
    if listed is not None and (not isinstance(listed, list) or not all(isinstance(x, str) for x in listed)):
        raise ImageProblem(f"field `{f.images}` must be a list of image paths", field=f.images)
    listed = list(listed or [])
    if isinstance(prompt, str):
        if not prompt:
            raise ImageProblem(f"field `{f.prompt}` is empty", field=f.prompt)
        parts = [{"type": "image", "image": p} for p in listed] + [{"type": "text", "text": prompt}]
        parsed = parse_row([{f.role: "user", f.content: parts}], _source_reading(src, f.prompt), base)
        parsed.fields = [f"{f.images}[{k}]" for k in range(len(listed))]
        return parsed
    if not isinstance(prompt, list) or not prompt:
        raise ImageProblem(f"field `{f.prompt}` must be text or a list of chat messages", field=f.prompt)
    filled, k = [], 0
    for m in prompt:
        content = m.get(f.content) if isinstance(m, dict) else None
        if isinstance(content, list):
            parts = []
            for part in content:
                if isinstance(part, dict) and part.get("type") == "image" and not any(part.get(x) for x in IMAGE_KEYS):
                    if k >= len(listed):
                        raise ImageProblem(f"the prompt has more `{{type: image}}` parts without a file than field "
                                           f"`{f.images}` lists ({len(listed)})", field=f.images)
                    part = {**part, "image": listed[k]}
                    k += 1
                parts.append(part)
            m = {**m, f.content: parts}
        filled.append(m)
    if k != len(listed):
        raise ImageProblem(f"field `{f.images}` lists {len(listed)} image(s), but the prompt has {k} `{{type: "
                           "image}` part(s) without a file to fill", hint="put one `{type: image}` part in the "
                           "prompt per listed image, where it belongs", field=f.images)
    parsed = parse_row(filled, _source_reading(src, f.prompt), base)
    if parsed.messages and parsed.messages[-1]["role"] == "assistant":
        raise ImageProblem("the prompt ends with an assistant message: it is what the model answers",
                           hint="end the prompt with a user message", field=f"{f.prompt}[{len(prompt) - 1}]")
    return parsed


def completion_text(value, src, field: str) -> str:
    """A preference completion (`chosen`, `rejected`): a string, or assistant messages whose text is joined."""
    f = src.spec.fields
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and value:
        out = []
        for k, m in enumerate(value):
            content = m.get(f.content) if isinstance(m, dict) else None
            if not isinstance(m, dict) or m.get(f.role) not in (None, "assistant", "gpt"):
                raise ImageProblem("a completion holds assistant messages only", field=f"{field}[{k}]")
            if isinstance(content, str):
                out.append(content)
            elif isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                                   and isinstance(p.get("text"), str) for p in content):
                out.append("".join(p["text"] for p in content))
            else:
                raise ImageProblem("a completion's content is text (models generate text only)",
                                   field=f"{field}[{k}].{f.content}")
        if "".join(out):
            return "".join(out)
    raise ImageProblem(f"field `{field}` is empty or not text", field=field)


def _source_reading(src, key: str):
    """`src` as `parse_row` reads it, its messages taken from column `key` (a prompt's messages are named
    `prompt[0].content[1].image` in errors)."""
    from types import SimpleNamespace

    f = src.spec.fields
    fields = SimpleNamespace(messages=key, role=f.role, content=f.content)
    return SimpleNamespace(spec=SimpleNamespace(fields=fields, roles=src.spec.roles))


URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def _resolve(value: str, base: Path, where: str) -> str:
    """The image's path as written (relative to the data file's folder, or absolute). A URL (any scheme:
    http, file, s3, ...) is refused as one; a relative path that a symlink takes out of the data folder is refused
    (the same containment as a recipe's `extends`), named as written, never by its target."""
    if URL.match(value):
        raise ImageProblem(f"image {value} is a URL: ftune reads image files (no network while preprocessing)",
                           hint="download the images next to the data file and name them by relative path",
                           field=where)
    path = Path(value).expanduser()
    if path.is_absolute():
        return str(path)
    joined = Path(os.path.normpath(base / path))
    inside = joined == base or base in joined.parents  # as written (`..` is the user's own choice)
    if inside and joined.exists() and not joined.resolve().is_relative_to(base.resolve()):
        raise ImageProblem(f"image {value} is a symlink that leads out of the data folder {base}",
                           hint="copy the image into the data folder, or name it by its absolute path", field=where)
    return str(joined)


def text_of(messages: list[dict]) -> list[dict]:
    """The messages with every content a string (image parts dropped): what a text-only renderer reads."""
    return [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str) else
             "".join(p["text"] for p in m["content"] if p["type"] == "text")} for m in messages]


def read_rows(src) -> list[dict] | None:
    """A local JSON/JSONL source's rows read with the standard library (content may be text in one message and a
    list of parts in the next, which Arrow can't type); None for other kinds (the caller loads them)."""
    if src.kind != "json" or not Path(src.path).is_file():
        return None
    text = Path(src.path).read_text(encoding="utf-8")
    if src.path.endswith(".jsonl"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    data = json.loads(text)
    return data if isinstance(data, list) else data.get(src.spec.split, data.get("data", []))


# ------------------------------------------------------------------------------------------ one image
HIGH_DEPTH = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")


def open_image(path: str, settings, where: str | None = None):
    """The image at `path`, RGB, resized as `settings` (`data.images`) says; returns (image, notes). Raises
    ImageProblem (at field `where`) for a missing file, a file that isn't an image, a truncated or huge one."""
    from PIL import Image, UnidentifiedImageError

    p = Path(path)
    if not p.exists():
        raise ImageProblem(f"image {path} does not exist", hint="image paths are relative to the data file",
                           field=where)
    if not p.is_file():  # never opened: a FIFO would block, /dev/zero never ends
        raise ImageProblem(f"image {path} exists but is {_kind(p)}, not a regular file",
                           hint="name an image file (PNG, JPEG, WebP, ...)", field=where)
    notes: list[str] = []
    try:
        with Image.open(p) as img:
            size = img.size
            if settings.resize == "none" and size[0] * size[1] > settings.max_pixels:
                raise _too_big(path, size, settings, where)
            img.load()
            image = _to_rgb(img, notes)
    except Image.DecompressionBombError as err:
        raise ImageProblem(f"image {path} is huge: {err}", hint="scale it down before training", field=where) from None
    except UnidentifiedImageError:
        raise ImageProblem(f"{path} is not an image PIL can read", hint="use PNG, JPEG, WebP, GIF, BMP or TIFF files",
                           field=where) from None
    except OSError as err:  # truncated files: "image file is truncated", "broken data stream"
        raise ImageProblem(f"image {path} can't be read: {err}", hint="the file looks truncated or corrupt; "
                           "re-export it", field=where) from None
    return _fit(image, path, settings, where, notes), notes


def _kind(p: Path) -> str:
    import stat

    mode = p.stat().st_mode
    return ("a folder" if stat.S_ISDIR(mode) else "a named pipe (FIFO)" if stat.S_ISFIFO(mode) else
            "a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "not a file")


def _too_big(path, size, settings, where) -> ImageProblem:
    return ImageProblem(f"image {path} is {size[0]}x{size[1]} = {size[0] * size[1]:,} pixels, beyond "
                        f"data.images.max_pixels ({settings.max_pixels:,}) and data.images.resize is none",
                        hint="set `data.images.resize: fit` (scales it down), raise max_pixels, or shrink the image",
                        field=where)


def _to_rgb(img, notes: list[str]):
    import numpy as np
    from PIL import Image

    if img.mode in HIGH_DEPTH:
        arr = np.asarray(img, dtype=np.float64)
        top = 65535.0 if img.mode.startswith("I;16") or arr.max() > 255 else 255.0
        notes.append(f"a high-bit-depth image ({img.mode}) was converted to 8-bit RGB")
        return Image.fromarray(np.clip(arr / top * 255.0 + 0.5, 0, 255).astype(np.uint8), "L").convert("RGB")
    if img.mode == "CMYK":
        notes.append("a CMYK image was converted to RGB")
    return img.convert("RGB")


def _fit(image, path, settings, where, notes):
    from PIL import Image

    w, h = image.size
    pixels = w * h
    if settings.min_pixels <= pixels <= settings.max_pixels:
        return image
    if settings.resize == "none":
        if pixels > settings.max_pixels:
            raise _too_big(path, image.size, settings, where)
        raise ImageProblem(f"image {path} is {w}x{h} = {pixels:,} pixels, below data.images.min_pixels "
                           f"({settings.min_pixels:,}) and data.images.resize is none",
                           hint="set `data.images.resize: fit` (scales it up), or lower min_pixels", field=where)
    target = settings.max_pixels if pixels > settings.max_pixels else settings.min_pixels
    scale = math.sqrt(target / pixels)
    size = (max(1, int(w * scale)), max(1, int(h * scale)))
    if size[0] * size[1] < settings.min_pixels:  # rounding down fell below the floor
        size = (max(1, math.ceil(w * scale)), max(1, math.ceil(h * scale)))
    return image.resize(size, Image.Resampling.BICUBIC)


def file_hash(path: str) -> str:
    """sha256 of an image file's bytes (the data cache key covers what the images hold, not their names)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
