"""Vision-language models: which part a module or parameter belongs to (vision tower, projector, language model).

One function decides it, `part_of`, so the planner's counts (the catalog), the peft stage's freezing and LoRA
targets, and the tests all agree. Names are matched by dotted segments anywhere in the name, so the same rule reads
a meta model's names, a checkpoint's keys in either layout (`model.visual.x` or `visual.x`) and a peft-wrapped
model's names (`base_model.model.model.visual.x.lora_A.default.weight`). No heavy imports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Part = Literal["vision", "projector", "language"]
PARTS: tuple[Part, ...] = ("vision", "projector", "language")


@dataclass(frozen=True)
class Layout:
    """Dotted name prefixes of a family's parts; everything else is the language model (with lm_head)."""

    vision: tuple[str, ...]
    projector: tuple[str, ...]


_QWEN = Layout(vision=("visual",), projector=("visual.merger", "visual.deepstack_merger_list"))
_IDEFICS = Layout(vision=("vision_model",), projector=("connector",))
_TOWER = Layout(vision=("vision_tower",), projector=("multi_modal_projector", "image_newline"))

# model_type -> layout, as transformers 5.23 names the modules (checked by tests/unit/test_vision_parts.py on
# tiny models built from configs)
LAYOUTS: dict[str, Layout] = {
    "qwen2_vl": _QWEN,
    "qwen2_5_vl": _QWEN,
    "qwen3_vl": _QWEN,
    "qwen3_vl_moe": _QWEN,
    "idefics3": _IDEFICS,
    "smolvlm": _IDEFICS,
    "llava": _TOWER,
    "llava_next": _TOWER,
    "llava_onevision": _TOWER,
    "gemma3": _TOWER,
    "paligemma": _TOWER,
    "mistral3": _TOWER,
    "mllama": Layout(vision=("vision_model",), projector=("multi_modal_projector",)),
}

IMAGE_LIMITS: dict[str, int] = {"llava": 1, "paligemma": 1}
"""Images per sample a family was trained with, where it has a limit (LLaVA-1.5, PaliGemma: one image per
prompt); `data.images.max_per_sample` overrides it."""

NEEDS_TORCHVISION: frozenset[str] = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "smolvlm",
                                               "llava_onevision", "mistral3"})
"""Families whose processor transformers 5.23 can't build without torchvision: it takes a video processor (Qwen-VL,
SmolVLM, LLaVA-OneVision), which needs torchvision even for images alone, or is torchvision-only (Pixtral, for
Mistral 3). Their image processors have a PIL backend, but AutoProcessor builds the video processor regardless.
Checked against transformers by tests/unit/test_vision_parts.py."""

TRL_IMAGES_REFUSED: dict[str, str] = {
    "paligemma": "its processor refuses text without images, and TRL 1.16's DPO collator tokenizes the chosen and "
                 "rejected completions in processor calls of their own, without the images (PaliGemma also has no "
                 "chat template: it builds its prefix and suffix itself)",
    "mllama": "its text attends to the image through `cross_attention_mask`, which TRL 1.16's DPO collator builds "
              "for the prompt alone and keeps, prompt-long, beside the prompt + completion ids",
}
"""The families `LAYOUTS` splits whose image rows TRL 1.16's DPO and GRPO trainers can't take, and why. The others
go through TRL's generic paths (the processor on `images` + text; GRPO slices `pixel_values` per image, or by
`image_grid_thw` for Qwen-VL, and passes `image_sizes`, `pixel_attention_mask`, `token_type_ids`,
`mm_token_type_ids`); LLaVA is learned end to end by tests/e2e/test_vision_preference.py."""


def trl_images_problem(model_type: str | None) -> str | None:
    """Why TRL's preference / RL trainers can't take this family's image rows; None when they can, or when the
    family is not known here (a hub id: the worker checks the loaded config)."""
    if model_type is None:
        return None
    if model_type in TRL_IMAGES_REFUSED:
        return TRL_IMAGES_REFUSED[model_type]
    if model_type not in LAYOUTS:
        return (f"ftune has no part layout for {model_type} (ftune.models.vision_parts.LAYOUTS), and its image path "
                "through TRL's trainers is unchecked")
    return None


# a model_type not in the table: any family's prefixes (projector first), so a new family still splits sensibly
_ANY = Layout(
    vision=tuple(sorted({p for lay in LAYOUTS.values() for p in lay.vision})),
    projector=tuple(sorted({p for lay in LAYOUTS.values() for p in lay.projector})),
)


def local_model_type(path: str) -> str | None:
    """`model_type` of the config.json in the folder `path`; None for a hub id or an unreadable config."""
    import json
    from pathlib import Path

    config = Path(path).expanduser() / "config.json"
    try:
        return json.loads(config.read_text()).get("model_type") if config.is_file() else None
    except (OSError, ValueError, AttributeError):
        return None


def is_vision_language(model_type: str | None) -> bool:
    """A model type whose modules `part_of` splits by a known layout."""
    return model_type in LAYOUTS


def _has(name: str, prefixes: tuple[str, ...]) -> bool:
    dotted = f".{name}."
    return any(f".{prefix}." in dotted for prefix in prefixes)


def part_of(name: str, model_type: str | None) -> Part:
    """The part of a vision-language model that module or parameter `name` belongs to.

    The projector (Qwen's `visual.merger`, Idefics3's `connector`, LLaVA's `multi_modal_projector`) is matched
    before the vision tower that may contain it; every other name (embeddings, decoder layers, lm_head) is the
    language model.
    """
    layout = LAYOUTS.get(model_type or "", _ANY)
    if _has(name, layout.projector):
        return "projector"
    if _has(name, layout.vision):
        return "vision"
    return "language"


def outermost(parameters: list[str], model_type: str | None, parts: set[str]) -> list[str]:
    """The outermost modules whose parameters (named in `parameters`) all belong to one of `parts`: what peft's
    modules_to_save wraps for a `full` part, and what a frozen tower runs without autograd."""
    of: dict[str, set[str]] = {}
    for name in parameters:
        pieces = name.split(".")
        for k in range(1, len(pieces)):
            of.setdefault(".".join(pieces[:k]), set()).add(part_of(name, model_type))
    pure = {n for n, found in of.items() if len(found) == 1 and next(iter(found)) in parts}
    return sorted(n for n in pure if "." not in n or n.rsplit(".", 1)[0] not in pure)


def called(modules: dict, names: list[str]) -> list[str]:
    """`names` of modules (`modules`: a model's `named_modules()` as a dict) with each container (ModuleList,
    ModuleDict: never called itself, and peft's modules_to_save refuses one) replaced by its members, recursively:
    Qwen3-VL's projector holds `visual.deepstack_merger_list`, a ModuleList beside `visual.merger`."""
    import torch

    out: list[str] = []
    for name in names:
        if isinstance(modules[name], torch.nn.ModuleList | torch.nn.ModuleDict):
            children = [n for n in modules if n.startswith(name + ".") and "." not in n[len(name) + 1:]]
            out += called(modules, children)
        else:
            out.append(name)
    return out
