"""What `ftune plan` says about a vision-language model: the parameters of the vision tower, the projector and the
language model (total and trainable, split by `ftune.models.vision_parts.part_of`, the one rule the peft stage uses too),
what one image costs (vision-encoder patches and language-model tokens, from `data.images.max_pixels` and the
model's patch and merge sizes), and the activations the image encoder keeps for backward.

The image arithmetic reads the model config, and for Qwen-VL the pixel budget of the model folder's image processor
(its JSON, `processor_pixel_cap`), as transformers' processors resize (no processor is loaded).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ftune.models.vision_parts import PARTS, part_of

QWEN = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")

DEFAULT_MAX_PIXELS = {
    "qwen2_vl": 12_845_056,  # the checkpoints' preprocessor_config.json: max_pixels 16384 x 28 x 28
    "qwen2_5_vl": 12_845_056,  # (transformers' class default, 1280 x 28 x 28, is not what the checkpoints load)
    "qwen3_vl": 16_777_216,  # Qwen3-VL's preprocessor_config.json: size.longest_edge (a pixel count) 4096 x 4096
    "qwen3_vl_moe": 16_777_216,
}
"""The pixels per image Qwen's processors allow (dynamic resolution): the cap over `data.images.max_pixels` when
the model folder's image processor doesn't say (`processor_pixel_cap`)."""

SMOLVLM_TILES_PER_EDGE = 4
"""Idefics3/SmolVLM processors resize the longest edge to 4 tiles (`size.longest_edge` = 4 x the vision tower's
image size: 1536 for SmolVLM2-2.2B, 1456 for Idefics3), then split into tiles plus one downscaled global image."""


@dataclass(frozen=True)
class ImageCost:
    pixels: int
    """The image area planned for: `data.images.max_pixels`, the processor's default, or the model's fixed size."""
    patches: int
    """Positions the vision encoder runs per image (for a square image, with dynamic resolution)."""
    tokens: int
    """Positions one image takes in the language model's sequence (image placeholders; the template's markers aside)."""
    how: str
    """The arithmetic, in one line."""


@dataclass(frozen=True)
class PartCount:
    params: int
    """The base model's parameters in this part."""
    trainable: int
    """Trainable after the method is applied (adapters included)."""
    mode: str | None = None
    """What the recipe asks of the part: `frozen`, `lora` or `full` (`peft.modules`; every part for `full`)."""


@dataclass(frozen=True)
class VisionFacts:
    model_type: str
    parts: dict[str, PartCount]
    """vision, projector, language."""
    image: ImageCost | None
    """None for a family whose image arithmetic ftune doesn't know (counts still exact)."""
    images_per_sample: int
    encoder_activation_bytes: int
    """What the vision tower and projector keep for backward per device (all images of the batch); with
    checkpointing (`checkpointed`), each vision layer's input and the projector's."""
    encoder_input_bytes: int = 0
    """Of which each vision layer's input: what checkpointing keeps of the tower."""
    encoder_layer_bytes: int = 0
    """Of which inside the vision layers (their inputs included): what checkpointing drops."""

    def checkpointed(self, on: bool) -> VisionFacts:
        """The facts with the encoder's activations as the layout keeps them."""
        if not on:
            return self
        kept = self.encoder_activation_bytes - self.encoder_layer_bytes + self.encoder_input_bytes
        return replace(self, encoder_activation_bytes=kept)


def _get(config, key: str, default=None):
    return config.get(key, default) if isinstance(config, dict) else getattr(config, key, default)


def model_type_of(config) -> str:
    return str(_get(config, "model_type", "") or "")


def processor_pixel_cap(folder) -> int | None:
    """The most pixels per image the image processor saved in the model folder `folder` allows (Qwen-VL's
    `max_pixels`, or `size.longest_edge`, a pixel count there); None without a folder or a readable cap."""
    import json
    from pathlib import Path

    if folder is None:
        return None
    for name in ("preprocessor_config.json", "processor_config.json"):
        path = Path(folder) / name
        try:
            data = json.loads(path.read_text()) if path.is_file() else None
        except (OSError, ValueError):
            data = None
        if not isinstance(data, dict):
            continue
        data = data.get("image_processor", data) if isinstance(data.get("image_processor"), dict) else data
        size = data.get("size") if isinstance(data.get("size"), dict) else {}
        cap = data.get("max_pixels") or size.get("max_pixels") or size.get("longest_edge")
        if isinstance(cap, int) and cap > 0:
            return cap
    return None


def image_cost(config, max_pixels: int | None = None, processor_cap: int | None = None) -> ImageCost | None:
    """Patches and tokens of one image, from the model config (a transformers config or its dict); Qwen-VL's
    within `processor_cap`, the pixels its image processor allows (else the checkpoints' default)."""
    kind = model_type_of(config)
    v = _get(config, "vision_config") or {}
    patch = _get(v, "patch_size")
    if kind in QWEN:  # smart_resize: each side rounded to a multiple of patch x merge, within the processor's budget
        merge = _get(v, "spatial_merge_size", 2)
        unit = patch * merge
        cap = processor_cap or DEFAULT_MAX_PIXELS[kind]
        pixels = min(max_pixels or cap, cap)
        per_edge = max(1, round(math.isqrt(pixels) / unit))
        tokens = max(1, min(per_edge * per_edge, cap // (unit * unit)))
        if max_pixels and max_pixels <= cap:
            source = "data.images.max_pixels"
        else:
            source = "the image processor's max_pixels" if processor_cap else "the processor's default max_pixels"
        return ImageCost(pixels, tokens * merge * merge, tokens,
                         f"a square image of {source} {pixels:,}: {per_edge} x {per_edge} tokens of "
                         f"({patch} x {merge})² pixels, {tokens * merge * merge:,} patches; other shapes within 10%")
    size = _get(v, "image_size")
    if kind in ("gemma3", "paligemma", "llava") and size and patch:
        grid = (size // patch) ** 2
        if kind == "gemma3":
            tokens, extra = _get(config, "mm_tokens_per_image", 256), " pooled"
        elif kind == "llava":
            keeps_cls = _get(config, "vision_feature_select_strategy", "default") == "full"
            tokens, extra = grid + keeps_cls, ""
            grid += 1  # CLIP's class token
        else:
            tokens, extra = grid, ""
        return ImageCost(size * size, grid, tokens, f"every image resized to {size}x{size}: ({size} / {patch})² = "
                         f"{(size // patch) ** 2:,} patches, {tokens:,}{extra} tokens (data.images.max_pixels "
                         "changes neither)")
    if kind in ("smolvlm", "idefics3") and size and patch:
        scale = _get(config, "scale_factor", 2)
        longest = SMOLVLM_TILES_PER_EDGE * size
        side = min(math.isqrt(max_pixels), longest) if max_pixels else longest
        per_edge = max(1, -(-side // size))
        tiles = per_edge * per_edge + (1 if per_edge > 1 else 0)  # the tiles and the global image
        per_tile = (size // patch) ** 2
        tokens = tiles * (per_tile // (scale * scale))
        return ImageCost(side * side, tiles * per_tile, tokens,
                         f"a square image of {side}x{side}: {per_edge}x{per_edge} tiles of {size}"
                         f"{' + 1 global image' if per_edge > 1 else ''}, each ({size} / {patch})² = {per_tile} "
                         f"patches, {per_tile // (scale * scale)} tokens after the {scale}x{scale} pixel shuffle")
    return None


def base_parts(recipe, model, config) -> dict[str, tuple[int, int]] | None:
    """`count_by_part` of the base model for `model.task: image-text-to-text` (before the method adds to it)."""
    from ftune.models.catalog import VISION_TASK

    return count_by_part(model, model_type_of(config)) if recipe.model.task == VISION_TASK else None


def count_by_part(model, model_type: str) -> dict[str, tuple[int, int]]:
    """(parameters, trainable) per part; tied weights once."""
    seen: set[int] = set()
    out = {part: [0, 0] for part in PARTS}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            continue
        seen.add(id(p))
        row = out[part_of(name, model_type)]
        row[0] += p.numel()
        row[1] += p.numel() if p.requires_grad else 0
    return {part: (a, b) for part, (a, b) in out.items()}


def encoder_activations(config, cost: ImageCost, *, images: int, itemsize: int, vision_trains: bool,
                        projector_trains: bool) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """What the image encoder keeps for backward, for `images` images: (per vision layer, each vision layer's
    input, the projector's). The same textbook figure as the text fallback (17 x hidden x itemsize bytes per
    position per layer, SDPA attention, Korthikanti et al. 2022); the projector keeps its input and its hidden
    activations (2 x patches x vision hidden + tokens x text hidden). Nothing is kept for a frozen part with
    nothing trainable before it."""
    v = _get(config, "vision_config") or {}
    hidden = _get(v, "hidden_size", 0) or 0
    layers = _get(v, "depth") or _get(v, "num_hidden_layers") or 0
    text = _get(config, "text_config") or config
    text_hidden = _get(text, "hidden_size", 0) or 0
    positions = images * cost.patches
    per_layer, inputs = (), ()
    if vision_trains:
        per_layer = (positions * 17 * hidden * itemsize,) * layers
        inputs = (positions * hidden * itemsize,) * layers
    projector = 0
    if vision_trains or projector_trains:
        projector = (2 * positions * hidden + images * cost.tokens * text_hidden) * itemsize
    return per_layer, inputs, projector


def vision_facts(base_counts: dict[str, tuple[int, int]], model, config, *, max_pixels: int | None,
                 images_per_sample: int, batch: int, itemsize: int, notes: list[str], seq: int,
                 modes: dict[str, str] | None = None, processor_cap: int | None = None) -> tuple[VisionFacts, tuple]:
    """The plan's vision facts, and the image encoder's activations to add to the language model's profile.

    `base_counts`: `count_by_part` of the base model (before the method); `model`: after it."""
    kind = model_type_of(config)
    after = count_by_part(model, kind)
    parts = {part: PartCount(base_counts[part][0], after[part][1], (modes or {}).get(part)) for part in PARTS}
    cost = image_cost(config, max_pixels, processor_cap)
    extra = ((), (), 0)
    if cost is None:
        notes.append(f"vision: the image arithmetic of model type {kind!r} is not known to ftune: image tokens and "
                     "the image encoder's activations are not counted")
    else:
        extra = encoder_activations(config, cost, images=batch * images_per_sample, itemsize=itemsize,
                                    vision_trains=parts["vision"].trainable > 0,
                                    projector_trains=parts["projector"].trainable > 0)
        if cost.tokens * images_per_sample > seq:
            notes.append(f"vision: {images_per_sample} image(s) of {cost.tokens:,} tokens exceed the {seq:,}-token "
                         "rows: lower data.images.max_pixels or raise data.max_seq_length")
    total = sum(extra[0]) + extra[2]
    return VisionFacts(kind, parts, cost, images_per_sample, total, sum(extra[1]), sum(extra[0])), extra


def with_images(recipe, base_counts, model, config, profile, *, batch: int, seq: int, itemsize: int,
                notes: list[str]):
    """The vision facts, and the activation profile with the image encoder's layers and projector added (the
    probe ran the language model on text positions; the image placeholders are among its `seq` tokens)."""
    from dataclasses import replace

    from ftune.hub import folder

    images, peft = recipe.data.images, recipe.peft
    modes = peft.part_modes()
    facts, (layers, inputs, projector) = vision_facts(
        base_counts, model, config, max_pixels=images.max_pixels, images_per_sample=images.max_per_sample or 1,
        batch=batch, itemsize=itemsize, notes=notes, seq=seq, modes=modes,
        processor_cap=processor_pixel_cap(folder(recipe.model.path, recipe.model.revision)))
    profile = replace(profile, layer_bytes=profile.layer_bytes + layers,
                      layer_input_bytes=profile.layer_input_bytes + inputs, outside_bytes=profile.outside_bytes + projector)
    return facts, profile
