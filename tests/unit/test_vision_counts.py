"""The catalog's vision-language models: each part's parameters (vision tower, projector, language model), counted on
the real transformers class built from the catalog config on the meta device and split by `part_of`, equal a closed
form written from the config alone, and the totals equal the published ones; what one image costs."""

from __future__ import annotations

import json
from functools import cache

import pytest

from ftune.models import catalog
from ftune.estimate.vision_cost import count_by_part, image_cost

# Published totals (the hub checkpoints' safetensors metadata / model cards), each equal to the closed form below.
PUBLISHED = {
    "Qwen/Qwen2.5-VL-7B-Instruct": 8_292_166_656,
    "Qwen/Qwen3-VL-8B-Instruct": 8_767_123_696,
    "google/gemma-3-4b-it": 4_300_079_472,
    "google/gemma-3-12b-it": 12_187_325_040,
    "HuggingFaceTB/SmolVLM2-2.2B-Instruct": 2_246_784_880,
    "llava-hf/llava-1.5-7b-hf": 7_063_427_072,
    "google/paligemma2-3b-pt-224": 3_032_242_416,
}


def _siglip(v) -> int:
    """SigLIP / Idefics3 vision transformer: patch conv (with bias), one position per patch, layers, final norm."""
    h, i, p = v.hidden_size, v.intermediate_size, v.patch_size
    layer = 2 * 2 * h + 4 * (h * h + h) + (h * i + i) + (i * h + h)  # 2 LayerNorms, q/k/v/out, fc1, fc2
    return 3 * p * p * h + h + (v.image_size // p) ** 2 * h + v.num_hidden_layers * layer + 2 * h


def _clip(v) -> int:
    """CLIP vision transformer: class token, patch conv (no bias), positions (patches + class), pre/post norms."""
    h, i, p = v.hidden_size, v.intermediate_size, v.patch_size
    layer = 2 * 2 * h + 4 * (h * h + h) + (h * i + i) + (i * h + h)
    return h + 3 * p * p * h + ((v.image_size // p) ** 2 + 1) * h + 2 * h + v.num_hidden_layers * layer + 2 * h


def _decoder(t, kind: str) -> int:
    """A text decoder with its head (once when tied): embeddings, layers, final norm."""
    h, layers, vocab = t.hidden_size, t.num_hidden_layers, t.vocab_size
    head_dim = getattr(t, "head_dim", None) or h // t.num_attention_heads
    q, kv = t.num_attention_heads * head_dim, t.num_key_value_heads * head_dim
    attention = 2 * h * q + 2 * h * kv
    if kind == "qwen2":
        attention += q + 2 * kv  # q, k, v biases
    if kind in ("qwen3", "gemma3"):
        attention += 2 * head_dim  # q_norm, k_norm
    norms = (4 if kind.startswith("gemma") else 2) * h
    tied = kind.startswith("gemma")
    return vocab * h * (1 if tied else 2) + layers * (attention + 3 * h * t.intermediate_size + norms) + h


def closed_form(config) -> dict[str, int]:
    """Parameters per part of a catalog VLM from its config alone (transformers' defaults filled in)."""
    kind, v, t = config.model_type, config.vision_config, config.get_text_config()
    if kind == "qwen2_5_vl":
        h, i, merged = v.hidden_size, v.intermediate_size, v.hidden_size * v.spatial_merge_size ** 2
        block = 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + 2 * (h * i + i) + (i * h + h)  # RMSNorms, qkv, gated MLP
        vision = 3 * v.temporal_patch_size * v.patch_size ** 2 * h + v.depth * block
        projector = h + (merged * merged + merged) + (merged * v.out_hidden_size + v.out_hidden_size)
        return {"vision": vision, "projector": projector, "language": _decoder(t, "qwen2")}
    if kind == "qwen3_vl":
        h, i, merged = v.hidden_size, v.intermediate_size, v.hidden_size * v.spatial_merge_size ** 2
        block = 4 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h)  # LayerNorms, qkv, MLP
        conv = 3 * v.temporal_patch_size * v.patch_size ** 2 * h + h
        vision = conv + v.num_position_embeddings * h + v.depth * block
        mlp = (merged * merged + merged) + (merged * v.out_hidden_size + v.out_hidden_size)
        deepstack = len(v.deepstack_visual_indexes) * (2 * merged + mlp)  # each normalises after the shuffle
        return {"vision": vision, "projector": 2 * h + mlp + deepstack, "language": _decoder(t, "qwen3")}
    if kind == "gemma3":  # RMS-normed soft embeddings, one projection matrix
        projector = v.hidden_size + v.hidden_size * t.hidden_size
        return {"vision": _siglip(v), "projector": projector, "language": _decoder(t, "gemma3")}
    if kind == "paligemma":
        projector = v.hidden_size * v.projection_dim + v.projection_dim
        return {"vision": _siglip(v), "projector": projector, "language": _decoder(t, "gemma2")}
    if kind == "smolvlm":  # pixel shuffle by scale_factor, one linear without bias
        projector = v.hidden_size * config.scale_factor ** 2 * t.hidden_size
        return {"vision": _siglip(v), "projector": projector, "language": _decoder(t, "llama")}
    if kind == "llava":  # two linears with biases, GELU between
        h = t.hidden_size
        projector = v.hidden_size * h + h + h * h + h
        return {"vision": _clip(v), "projector": projector, "language": _decoder(t, "llama")}
    raise AssertionError(f"no closed form for {kind}")


@cache
def config_of(model_id: str):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(catalog.entries(vision=True)[model_id]))


@cache
def model_of(model_id: str):
    """The real transformers class on the meta device (about a second), built once per test process, and only
    where a test needs it (xdist spreads the tests over workers)."""
    import torch
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):
        return AutoModelForImageTextToText.from_config(config_of(model_id))


def test_the_catalog_holds_the_issues_families():
    assert set(catalog.entries(vision=True)) == set(PUBLISHED)
    assert {config_of(m).model_type for m in PUBLISHED} == {"qwen2_5_vl", "qwen3_vl", "gemma3", "smolvlm", "llava",
                                                         "paligemma"}


@pytest.mark.parametrize("model_id", sorted(PUBLISHED))
def test_each_part_equals_its_closed_form_and_the_total_the_published_one(model_id):
    config = config_of(model_id)
    counts = count_by_part(model_of(model_id), config.model_type)
    expected = closed_form(config)
    assert {part: total for part, (total, _) in counts.items()} == expected
    assert sum(expected.values()) == PUBLISHED[model_id]
    assert all(trainable == total for total, trainable in counts.values())  # nothing frozen before the method


def test_named_parts_as_published():
    """Spot figures a reader can check against the model cards: Qwen2.5-VL-7B's 632M-parameter ViT and its 45M
    merger; Gemma 3's SigLIP tower, the same 417M at 4B and 12B; LLaVA-1.5's CLIP ViT-L/14-336 (304M)."""
    def parts(model_id):
        counts = count_by_part(model_of(model_id), config_of(model_id).model_type)
        return {part: total for part, (total, _) in counts.items()}

    assert parts("Qwen/Qwen2.5-VL-7B-Instruct") == {"vision": 631_975_680, "projector": 44_574_464,
                                                    "language": 7_615_616_512}
    assert parts("google/gemma-3-4b-it")["vision"] == parts("google/gemma-3-12b-it")["vision"] == 416_866_032
    assert parts("llava-hf/llava-1.5-7b-hf")["vision"] == 303_507_456


@pytest.mark.parametrize(
    ("model_id", "max_pixels", "patches", "tokens"),
    [
        ("Qwen/Qwen2.5-VL-7B-Instruct", 1024 * 28 * 28, 4096, 1024),  # (28 = 14 x 2)² pixels per token
        ("Qwen/Qwen2.5-VL-7B-Instruct", 1024 * 1024, 37 * 37 * 4, 37 * 37),  # 1024 / 28 = 36.6 rounds to 37
        ("Qwen/Qwen2.5-VL-7B-Instruct", None, 65_536, 16_384),  # the processor's 12,845,056 pixels
        ("Qwen/Qwen3-VL-8B-Instruct", 256 * 32 * 32, 1024, 256),  # patch 16, merge 2
        ("google/gemma-3-4b-it", 1024 * 28 * 28, 4096, 256),  # fixed 896 x 896, pooled to 256
        ("llava-hf/llava-1.5-7b-hf", None, 577, 576),  # 24 x 24 patches + CLIP's class token
        ("google/paligemma2-3b-pt-224", None, 256, 256),
        ("HuggingFaceTB/SmolVLM2-2.2B-Instruct", 384 * 384, 729, 81),  # one 384 tile, 3 x 3 shuffle
        ("HuggingFaceTB/SmolVLM2-2.2B-Instruct", 768 * 768, 5 * 729, 5 * 81),  # 2 x 2 tiles + the global image
        ("HuggingFaceTB/SmolVLM2-2.2B-Instruct", None, 17 * 729, 17 * 81),  # 1536: 4 x 4 tiles + global
    ],
)
def test_image_cost_from_the_config(model_id, max_pixels, patches, tokens):
    cost = image_cost(config_of(model_id), max_pixels)
    assert (cost.patches, cost.tokens) == (patches, tokens)


def test_image_cost_matches_the_qwen_processor_resize():
    """An image scaled to fit data.images.max_pixels (keeping its aspect), then Qwen's own smart_resize: the square
    image gets the planned tokens exactly, every other shape within 10%."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize  # no torchvision

    budget = 640 * 28 * 28
    cost = image_cost({"model_type": "qwen2_5_vl", "vision_config": {"patch_size": 14, "spatial_merge_size": 2}},
                      budget)
    seen = []
    for h, w in [(4000, 4000), (4000, 1000), (1000, 4000), (3000, 2000), (717, 1280), (5000, 300), (2000, 2100)]:
        scale = min(1.0, (budget / (h * w)) ** 0.5)
        rh, rw = smart_resize(int(h * scale), int(w * scale), factor=28, min_pixels=56 * 56, max_pixels=12_845_056)
        seen.append(rh * rw // (28 * 28))
    assert cost.tokens == seen[0] == 625  # 708 x 708 px: 25 x 25 tokens
    assert all(abs(n - cost.tokens) <= 0.1 * cost.tokens for n in seen), seen


def test_a_qwen_image_is_planned_within_the_model_folder_s_image_processor(tmp_path):
    """The pixels a Qwen-VL image processor allows are read from the model folder (`max_pixels` in
    preprocessor_config.json, or `size.longest_edge`, a pixel count, inside transformers 5's processor_config.json):
    an image processor capped at 56 x 56 gives 4 tokens of 16 patches whatever data.images.max_pixels says, where
    the checkpoints' default would plan 16,384 tokens (and warn that an image overflows a 64-token row)."""
    from ftune.estimate.vision_cost import processor_pixel_cap

    config = {"model_type": "qwen2_vl", "vision_config": {"patch_size": 14, "spatial_merge_size": 2}}
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "processor_config.json").write_text(json.dumps(
        {"image_processor": {"size": {"shortest_edge": 784, "longest_edge": 3136}}, "processor_class": "X"}))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "preprocessor_config.json").write_text(json.dumps({"max_pixels": 200_704, "min_pixels": 3136}))
    (tmp_path / "c").mkdir()
    assert [processor_pixel_cap(tmp_path / k) for k in "abc"] + [processor_pixel_cap(None)] == [3136, 200_704,
                                                                                                 None, None]
    small = image_cost(config, 1024 * 1024, processor_pixel_cap(tmp_path / "a"))
    assert (small.patches, small.tokens) == (16, 4) and "image processor's max_pixels 3,136" in small.how
    within = image_cost(config, 128 * 28 * 28, processor_pixel_cap(tmp_path / "b"))  # data's budget below the cap
    assert within.tokens == 121 and "data.images.max_pixels" in within.how  # round(sqrt(100,352) / 28) = 11, 11²
    assert image_cost(config, None, None).tokens == 16_384  # no folder: the checkpoints' default
