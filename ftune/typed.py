"""Inputs typed where they enter: a list or a dict where text is expected is refused with the hint that fits,
never stringified into training text ("[1, 2, 3]") or a prompt.

Light (no imports): the data stage, `validate --check-paths`, the importers and `generate --file` all ask
`not_text` about a value they are about to treat as text.
"""

from __future__ import annotations

IMAGE_TYPES = frozenset({"image", "image_url", "input_image", "video", "audio", "input_audio"})


def _has_media(value: object) -> bool:
    if isinstance(value, dict):
        return str(value.get("type", "")) in IMAGE_TYPES or any(k in value for k in ("image", "image_url"))
    if isinstance(value, list):
        return any(_has_media(v) for v in value)
    return False


def not_text(value: object) -> tuple[str, str] | None:
    """None when `value` can be read as text (a string, a number); else (what it is, a hint that fits)."""
    if not isinstance(value, (list, tuple, dict)):
        return None
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) and not isinstance(v, bool)
                                                           for v in value):
        return ("a list of token ids", "pre-tokenized rows go in `format: pretokenized` (an `input_ids` column, "
                "with the model's own tokenizer); or detokenize them into text")
    if _has_media(value):
        return ("image (or other media) parts", "a text-only model reads text: keep the text parts only, as one "
                "string; to train on the images, use `format: vision-chat` with `model.task: image-text-to-text` "
                "(docs/vision.md)")
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, dict) and v.get("type") == "text"
                                                           for v in value):
        return ("a list of text parts", "join the parts' `text` into one string")
    kind = "a list" if isinstance(value, (list, tuple)) else "an object"
    return (f"{kind} ({_short(value)})", "this field must be a string")


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
