"""Image rows into TRL's trainers (`vision-preference` for DPO, `vision-prompt` for GRPO): the rows keep their images
as paths (`ftune.datastage.vision_rows`); here they are opened as the data stage read them (`ftune.datafiles.images`:
RGB, resized into `data.images`), as each batch is drawn, so no pixel is held in the cache or in memory between
steps. TRL builds the pixel inputs (its processor calls) and the loss."""

from __future__ import annotations

import json


def is_processor(processing_class) -> bool:
    """A vision-language model's processor (image processor + tokenizer), not a bare tokenizer."""
    return getattr(processing_class, "image_processor", None) is not None


def _open(paths, settings) -> list:
    from ftune.datafiles.images import open_image

    return [open_image(p, settings)[0] for p in paths or []]


def preference_collator(processor, settings, max_length: int | None):
    """TRL's DataCollatorForVisionPreference, the rows' image paths opened first (DPO on vision-preference rows:
    the prompt, rendered with its image placeholders, is expanded by the processor on the row's images)."""
    from trl.trainer.dpo_trainer import DataCollatorForVisionPreference

    inner = DataCollatorForVisionPreference(processor=processor, max_length=max_length)

    def collate(examples: list[dict]) -> dict:
        return inner([{**e, "images": _open(e.get("images"), settings)} for e in examples])

    return collate


def prompt_rows(dataset, settings):
    """The vision-prompt rows as GRPO reads them, converted as each is drawn: `prompt` from its JSON messages
    (image parts bare `{type: image}`, which TRL fills in order), `images` opened."""
    if dataset is None:
        return None

    def convert(batch: dict) -> dict:
        out = dict(batch)
        out["prompt"] = [json.loads(p) for p in batch["prompt"]]
        out["images"] = [_open(paths, settings) for paths in batch["images"]]
        return out

    return dataset.with_transform(convert)
