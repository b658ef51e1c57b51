"""Prompts with images for a vision-language run: `ftune generate --image` and `--file` rows whose messages carry
image parts (as in `format: vision-chat` data), and `ftune chat`'s `/image`.

A prompt is a list of vision-chat messages (content: text, or parts `{type: text|image}`), read by the data stage's
own `parse_row` and `open_image` (so an image is checked, converted and resized as the run's data was:
`data.images`), rendered with the run's chat template by the processor saved with the model (final/ or merged/),
its image placeholders expanded by the processor; the pixel inputs of a batch come from the collator's
`pixel_inputs`. Parsing needs no processor and no torch, so bad rows are found before a model is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ftune.errors import FtuneError, UsageError

TASK = "image-text-to-text"
NEEDS_VLM_HINT = "pass the run dir (or final/, or its merged folder) of a run trained on vision-chat data"


def is_vision(target) -> bool:
    """A target whose run trained a vision-language model (`model.task: image-text-to-text`)."""
    return target.plan is not None and target.plan.recipe.model.task == TASK


def settings_of(target):
    """The run's `data.images` (how images are read and resized), and the most images a prompt may carry."""
    return target.plan.recipe.data.images, target.plan.data.max_images


@dataclass
class ImagePrompt:
    """One prompt as the chat template reads it: image parts as `{type: image}` (in order), the images' absolute
    paths and the opened images (RGB, resized as `data.images` says)."""

    messages: list[dict]
    images: list[str] = field(default_factory=list)
    pictures: list = field(default_factory=list)


def as_messages(prompt, images: list[str] = ()) -> list[dict]:
    """A prompt row (text, `{prompt}`, `{instruction, input}` or `{messages}`) as vision-chat messages, `images`
    (absolute paths) shown before the text of its last user message."""
    if isinstance(prompt, dict) and "messages" in prompt:
        messages = [dict(m) if isinstance(m, dict) else m for m in prompt["messages"]]
    else:
        if isinstance(prompt, dict) and "instruction" in prompt:
            text = f"{prompt['instruction']}\n\n{prompt.get('input') or ''}".strip()
        else:
            text = prompt.get("prompt", "") if isinstance(prompt, dict) else str(prompt)
        messages = [{"role": "user", "content": text}]
    if images:
        last = max((k for k, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"), default=None)
        if last is None:
            messages.append({"role": "user", "content": []})
            last = len(messages) - 1
        content = messages[last].get("content")
        parts = content if isinstance(content, list) else ([{"type": "text", "text": content}] if content else [])
        messages[last] = {**messages[last], "content": [*({"type": "image", "image": p} for p in images), *parts]}
    return messages


_SOURCE = None


def _source():
    """The stand-in data source `parse_row` reads field names and roles from: vision-chat's defaults."""
    global _SOURCE
    if _SOURCE is None:
        from types import SimpleNamespace

        from ftune.recipe.schema import DataSource

        _SOURCE = SimpleNamespace(spec=DataSource(path="prompts.jsonl", format="vision-chat"))
    return _SOURCE


def image_prompt(messages: list[dict], base: Path, settings, max_images: int | None = None) -> ImagePrompt:
    """`messages` (vision-chat, image paths relative to `base`) parsed and their images opened; raises
    `ftune.datafiles.images.ImageProblem` naming the field (`messages[0].content[1].image`), as the data stage does."""
    from ftune.datafiles.images import ImageProblem, open_image, parse_row

    row = parse_row(messages, _source(), base)
    if max_images is not None and len(row.images) > max_images:
        raise ImageProblem(f"{len(row.images)} images, but the model takes at most {max_images} per sample",
                           hint="show fewer images (data.images.max_per_sample sets the limit where the model "
                           "allows more)", field=row.fields[max_images])
    pictures = [open_image(path, settings, at)[0] for path, at in zip(row.images, row.fields)]
    return ImagePrompt(row.messages, row.images, pictures)


def check_images(paths: list[str], settings, flag: str = "--image") -> list[str]:
    """Absolute paths of images named on the command line, each opened once (a usage error, exit 2, if one can't
    be used)."""
    from ftune.datafiles.images import ImageProblem, open_image

    out = []
    for p in paths:
        path = str(Path(p).expanduser().resolve())
        try:
            open_image(path, settings, flag)
        except ImageProblem as err:
            hint = f"{flag} takes a path relative to the current folder, or an absolute one" if not \
                Path(path).exists() else err.hint
            raise UsageError(f"{flag} {path}: {err.message}", hint=hint) from None
        out.append(path)
    return out


@dataclass
class Vision:
    """What a vision-language model's prompts are encoded with: its processor, the run's chat template and image
    settings."""

    processor: object
    template: str
    settings: object  # data.images

    def encode(self, prompt: ImagePrompt) -> list[int]:
        """Token ids of `prompt` ending with the generation prompt, each image placeholder expanded."""
        proc = self.processor
        text = proc.apply_chat_template(prompt.messages, chat_template=self.template, tokenize=False,
                                        add_generation_prompt=True)
        if not prompt.pictures:
            return list(proc.tokenizer(text, add_special_tokens=False)["input_ids"])
        ids = proc(text=[text], images=[prompt.pictures], add_special_tokens=False)["input_ids"][0]
        return [int(t) for t in ids]

    def pixels(self, paths: list[list[str]], ids) -> dict:
        """The model's image inputs for a batch whose prompts show `paths` (the collator's function)."""
        from ftune.datastage.vision_chat import pixel_inputs

        return pixel_inputs(self.processor, paths, self.settings, ids)


def load_vision(target) -> Vision:
    """The processor saved with the model (final/ or a merged folder), the run's chat template and data.images."""
    from ftune.datastage.vision_chat import template_of
    from ftune.datastage.tokenizer import load_processor_at

    recipe = target.plan.recipe
    try:
        proc = load_processor_at(str(target.model_dir), recipe, token=target.plan.secret("model.hub_token"))
    except FtuneError as err:
        raise FtuneError(f"{target.model_dir} holds no processor ftune can load ({err.message})",
                         hint="a vision-language run saves its processor in final/ (and merge in the merged "
                         "folder); retrain, or copy the model's processor files there") from None
    return Vision(proc, template_of(recipe, proc), recipe.data.images)
