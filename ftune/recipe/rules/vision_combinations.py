"""Vision-language recipes (`model.task: image-text-to-text`, `format: vision-chat`): what they can combine with."""

from __future__ import annotations

from collections.abc import Iterator

from ftune.errors import Problem
from ftune.recipe.objectives import family_of
from ftune.recipe.schema import Recipe
from ftune.recipe.sources import sources

VLM = "image-text-to-text"


def format_needs_a_vision_model(recipe: Recipe) -> Iterator[Problem]:
    """vision-chat rows carry images a text-only model can't read; a VLM reads vision-chat rows only."""
    task = recipe.model.task
    for key, source in sources(recipe):
        if source.format == "vision-chat" and task != VLM:
            yield Problem.at(f"{key}.format", f"format 'vision-chat' carries images, but model.task is '{task}' "
                             "(a text-only model)", f"set `model.task: {VLM}` (a vision-language model), or use "
                             "`format: chat` for text-only conversations")
        elif task == VLM and source.format != "vision-chat":
            yield Problem.at(f"{key}.format", f"model.task '{VLM}' trains on `format: vision-chat` rows; this source "
                             f"has format '{source.format}'", "set `format: vision-chat` (a row's content may be "
                             "plain text: images are optional per row)")


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
    if not family_of(recipe).next_token_loss:
        yield Problem.at("train.objective", f"train.objective '{recipe.train.objective}' on a vision-language model "
                         "is not supported yet: ftune trains VLMs with supervised fine-tuning (sft) only",
                         "set `train.objective: sft` (DPO on vision pairs: see docs/vision.md)")
    if not recipe.peft.trains_vision_models:
        yield Problem.at("peft.method", f"peft.method '{recipe.peft.method}' is not supported on a vision-language "
                         "model", "use `peft.method: lora` (with peft.modules per part) or `full`")
    if d.images.min_pixels > d.images.max_pixels:
        yield Problem.at("data.images.min_pixels", f"min_pixels ({d.images.min_pixels}) is above max_pixels "
                         f"({d.images.max_pixels})", "make min_pixels <= max_pixels")
    modes = recipe.peft.part_modes()
    if recipe.peft.method == "full" and modes is not None and set(modes.values()) == {"frozen"}:
        yield Problem.at("peft.modules", "every part of the model is frozen under peft.method full: nothing trains",
                         "set at least one of peft.modules.vision / projector / language to full")
    if recipe.model.add_tokens:
        yield Problem.at("model.add_tokens", "added tokens are not supported on a vision-language model yet",
                         "remove model.add_tokens")


RULES = [format_needs_a_vision_model, vision_combinations]
