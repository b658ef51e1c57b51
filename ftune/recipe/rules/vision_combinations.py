"""Vision-language recipes (`model.task: image-text-to-text`, image rows: `vision-chat`, `vision-preference`,
`vision-prompt`): what they can combine with."""

from __future__ import annotations

from collections.abc import Iterator

from ftune.errors import Problem
from ftune.recipe.objectives import VISION_FORMATS, objective, registered, text_format, vision_format
from ftune.recipe.schema import Recipe
from ftune.recipe.sources import sources

VLM = "image-text-to-text"


def format_needs_a_vision_model(recipe: Recipe) -> Iterator[Problem]:
    """Image rows (`VISION_FORMATS`) carry images a text-only model can't read; a VLM reads image rows only."""
    task = recipe.model.task
    want = vision_format(objective(recipe.train.objective).data_format)
    for key, source in sources(recipe):
        if source.format in VISION_FORMATS and task != VLM:
            yield Problem.at(f"{key}.format", f"format '{source.format}' carries images, but model.task is '{task}' "
                             "(a text-only model)", f"set `model.task: {VLM}` (a vision-language model), or use "
                             f"`format: {text_format(source.format)}` for text-only rows")
        elif task == VLM and source.format not in VISION_FORMATS:
            yield Problem.at(f"{key}.format", f"model.task '{VLM}' trains on rows with images ({', '.join(VISION_FORMATS)}"
                             f"); this source has format '{source.format}'", f"set `format: {want}` (images are "
                             "optional per row)" if want else "use an objective that takes image rows")


def vision_combinations(recipe: Recipe) -> Iterator[Problem]:
    if recipe.model.task != VLM:
        if getattr(recipe.peft, "modules", None) is not None:
            yield Problem.at("peft.modules", "peft.modules splits a vision-language model into its parts; "
                             f"model.task is '{recipe.model.task}'", "remove peft.modules (or set "
                             f"`model.task: {VLM}`)")
        return
    d = recipe.data
    if d.packing:
        yield Problem.at("data.packing", "vision-chat rows can't be packed: a row's image tokens and its pixel "
                         "inputs must stay together, and the vision models' position ids (M-RoPE) don't restart "
                         "inside a packed row", "set `data.packing: false`")
    if d.streaming:
        yield Problem.at("data.streaming", "vision-chat data is not streamed yet (its images are checked and hashed "
                         "before training)", "set `data.streaming: false`")
    if not objective(recipe.train.objective).takes_images:
        able = [o.name for o in registered().values() if o.takes_images]
        yield Problem.at("train.objective", f"train.objective '{recipe.train.objective}' does not take image rows: "
                         f"on a vision-language model ftune runs {', '.join(able)} (TRL 1.16's trainers that build "
                         "pixel inputs)", "set `train.objective: dpo` on vision-preference rows, `grpo` on "
                         "vision-prompt rows, or `sft` on vision-chat rows (docs/vision.md)")
    if not recipe.peft.trains_vision_models:
        yield Problem.at("peft.method", f"peft.method '{recipe.peft.method}' is not supported on a vision-language "
                         "model", "use `peft.method: lora` (with peft.modules per part) or `full`")
    if d.images.min_pixels > d.images.max_pixels:
        yield Problem.at("data.images.min_pixels", f"min_pixels ({d.images.min_pixels}) is above max_pixels "
                         f"({d.images.max_pixels})", "make min_pixels <= max_pixels")
    modes = recipe.peft.part_modes()
    # full alone trains nothing once every part is frozen (LoRA's parts can still take an adapter): the one method
    if recipe.peft.method == "full" and modes is not None and set(modes.values()) == {"frozen"}:
        yield Problem.at("peft.modules", "every part of the model is frozen under peft.method full: nothing trains",
                         "set at least one of peft.modules.vision / projector / language to full")
    if recipe.model.add_tokens:
        yield Problem.at("model.add_tokens", "added tokens are not supported on a vision-language model yet",
                         "remove model.add_tokens")


RULES = [format_needs_a_vision_model, vision_combinations]
