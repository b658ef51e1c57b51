"""Prompts with images for a vision-language run (`ftune generate --image`): rendered with the processor saved in
the run's final/, the images read and resized as the run's data was (`data.images`), the placeholders expanded."""

from __future__ import annotations

from pathlib import Path

from ftune.errors import FtuneError, UsageError


def image_prompts(target, prompts: list, images: list[str]):
    """(token ids per prompt, image paths per prompt, pixels(paths, ids) -> model inputs) for `prompts` (text, or
    {prompt}) each shown `images` before its text."""
    from transformers import AutoProcessor

    from ftune.data.images import ImageProblem, open_image
    from ftune.recipe.schema import ImageSettings
    from ftune.dataset.vision import pixel_inputs

    recipe = target.plan.recipe if target.plan is not None else None
    if recipe is None or recipe.model.task != "image-text-to-text":
        raise UsageError("--image needs a vision-language run (model.task: image-text-to-text)",
                         hint="pass the run dir (or final/) of a run trained on vision-chat data")
    settings = recipe.data.images if recipe is not None else ImageSettings()
    paths = [str(Path(p).expanduser().resolve()) for p in images]
    pictures = []
    for path in paths:
        try:
            pictures.append(open_image(path, settings, "--image")[0])
        except ImageProblem as err:
            raise UsageError(f"--image {path}: {err.message}", hint=err.hint) from None
    try:
        proc = AutoProcessor.from_pretrained(str(target.model_dir))
    except (OSError, ValueError, TypeError) as err:
        raise FtuneError(f"{target.model_dir} holds no processor: {str(err).splitlines()[0]}",
                         hint="a vision-language run saves its processor in final/; retrain, or copy the model's "
                         "processor files there") from None
    encoded = []
    for prompt in prompts:
        text = prompt.get("prompt", "") if isinstance(prompt, dict) else str(prompt)
        messages = [{"role": "user", "content": [*({"type": "image"} for _ in paths), {"type": "text", "text": text}]}]
        rendered = proc.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = proc(text=[rendered], images=[pictures], add_special_tokens=False)["input_ids"][0]
        encoded.append([int(t) for t in ids])
    return encoded, [paths] * len(prompts), lambda batch, ids: pixel_inputs(proc, batch, settings, ids)
