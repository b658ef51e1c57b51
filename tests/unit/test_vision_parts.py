"""`ftune.models.vision_parts.part_of`: every parameter of a tiny model of each VLM family lands in the right part."""

from __future__ import annotations

import pytest

from ftune.models.vision_parts import LAYOUTS, part_of

_TEXT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64,
             vocab_size=300)
_MROPE = {"rope_type": "default", "mrope_section": [2, 2, 4]}
_SIGLIP = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=28,
               patch_size=14)
CONFIGS = {
    "qwen2_vl": dict(vision_config=dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2),
                     text_config=dict(_TEXT, rope_scaling=_MROPE)),
    "qwen2_5_vl": dict(vision_config=dict(depth=1, hidden_size=32, out_hidden_size=32, num_heads=2,
                                          intermediate_size=64, fullatt_block_indexes=[0]),
                       text_config=dict(_TEXT, rope_scaling=_MROPE)),
    "qwen3_vl": dict(vision_config=dict(depth=1, hidden_size=32, out_hidden_size=32, num_heads=2,
                                        intermediate_size=64, deepstack_visual_indexes=[0]),
                     text_config=dict(_TEXT, head_dim=16)),
    "idefics3": dict(vision_config=_SIGLIP, text_config=_TEXT, scale_factor=1),
    "smolvlm": dict(vision_config=_SIGLIP, text_config=_TEXT, scale_factor=1),
    "llava": dict(vision_config=dict(_SIGLIP, model_type="clip_vision_model", projection_dim=32),
                  text_config=dict(_TEXT, model_type="llama")),
    "gemma3": dict(vision_config=_SIGLIP, text_config=dict(_TEXT, head_dim=16), mm_tokens_per_image=4),
    "paligemma": dict(vision_config=_SIGLIP, text_config=dict(_TEXT, model_type="gemma2", head_dim=16)),
    "mllama": dict(vision_config=dict(hidden_size=32, num_hidden_layers=1, num_global_layers=1, attention_heads=2,
                                      intermediate_size=64, vision_output_dim=64, image_size=28, patch_size=14,
                                      max_num_tiles=1, intermediate_layers_indices=[0],
                                      supported_aspect_ratios=[[1, 1]]),
                   text_config=dict(_TEXT, num_hidden_layers=2, cross_attention_layers=[1], pad_token_id=0)),
}
# the first segment after the wrapper that each part's parameters start with, as transformers 5.23 builds them
EXPECTED = {
    "qwen2_vl": {"vision": {"visual"}, "projector": {"visual"}, "language": {"language_model", "lm_head"}},
    "idefics3": {"vision": {"vision_model"}, "projector": {"connector"}, "language": {"text_model", "lm_head"}},
    "llava": {"vision": {"vision_tower"}, "projector": {"multi_modal_projector"},
              "language": {"language_model", "lm_head"}},
}
EXPECTED |= {"qwen2_5_vl": EXPECTED["qwen2_vl"], "qwen3_vl": EXPECTED["qwen2_vl"], "smolvlm": EXPECTED["idefics3"],
             # Gemma ties lm_head to the embeddings: no parameter of its own
             "gemma3": EXPECTED["llava"] | {"language": {"language_model"}},
             "paligemma": EXPECTED["llava"] | {"language": {"language_model"}},
             "mllama": EXPECTED["llava"] | {"vision": {"vision_model"}}}


def _meta(model_type: str):
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    config = AutoConfig.for_model(model_type, **CONFIGS[model_type])
    with torch.device("meta"):
        return AutoModelForImageTextToText.from_config(config)


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_every_parameter_has_the_part_its_module_says(model_type):
    model = _meta(model_type)
    seen: dict[str, set[str]] = {"vision": set(), "projector": set(), "language": set()}
    for name, _ in model.named_parameters():
        head = name.removeprefix("model.").split(".")[0]
        seen[part_of(name, model_type)].add(head)
        # the same parameter under peft's wrapper and in a checkpoint without the `model.` prefix
        assert part_of(f"base_model.model.{name}", model_type) == part_of(name, model_type)
        assert part_of(name.removeprefix("model."), model_type) == part_of(name, model_type)
    assert seen == EXPECTED[model_type]
    assert model_type in LAYOUTS


def test_qwen_merger_is_the_projector_inside_the_vision_tower():
    assert part_of("model.visual.merger.mlp.0.weight", "qwen2_vl") == "projector"
    assert part_of("model.visual.blocks.0.attn.qkv.weight", "qwen2_vl") == "vision"
    assert part_of("model.visual.deepstack_merger_list.0.linear_fc1.weight", "qwen3_vl") == "projector"
    assert part_of("model.language_model.layers.0.self_attn.q_proj.weight", "qwen2_5_vl") == "language"
    assert part_of("lm_head.weight", "qwen2_5_vl") == "language"


def test_qwen3_vl_s_projector_trains_whole_through_the_members_of_its_module_list(tiny_tokenizer_dir):
    """Qwen3-VL's projector holds `visual.deepstack_merger_list`, a ModuleList, which peft's modules_to_save refuses
    (`modules_to_save cannot be applied to modules of type ModuleList`): the LoRA targets name its members, and the
    injected model trains every projector parameter. (The model needs no torchvision; its processor does.)"""
    import torch
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from ftune.methods.lora import Config, inject
    from ftune.models.vision_parts import called
    from ftune.tiny_vision import qwen_vl_parts

    config, _ = qwen_vl_parts(AutoTokenizer.from_pretrained(tiny_tokenizer_dir), family="qwen3_vl")
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config)
    assert called(dict(model.named_modules()), ["model.visual.deepstack_merger_list", "model.visual.merger"]) == [
        "model.visual.deepstack_merger_list.0", "model.visual.merger"]
    projector = [n for n, _ in model.named_parameters() if part_of(n, "qwen3_vl") == "projector"]
    wrapped = inject(model, Config(method="lora", r=4, alpha=8, target_modules="all-linear"), "image-text-to-text")
    trains = {n for n, p in wrapped.named_parameters() if p.requires_grad}
    saved = {n for n in trains if ".modules_to_save.default." in n}
    assert {n.split(".modules_to_save.")[0] for n in saved} == {
        "base_model.model.model.visual.deepstack_merger_list.0", "base_model.model.model.visual.merger"}
    assert len(saved) == len(projector)  # every projector tensor trains, in its saved copy
    assert not [n for n in trains if part_of(n, "qwen3_vl") == "vision"]


def test_names_match_whole_segments_only():
    # `visualize` is not `visual`, `connectors` not `connector`
    assert part_of("model.language_model.visualize.weight", "qwen2_vl") == "language"
    assert part_of("model.text_model.connectors.weight", "idefics3") == "language"


def test_an_unknown_family_uses_every_known_layout_and_a_text_model_is_all_language():
    assert part_of("model.vision_tower.encoder.layers.0.mlp.fc1.weight", "new_vlm") == "vision"
    assert part_of("model.multi_modal_projector.linear_1.weight", None) == "projector"
    assert part_of("model.layers.0.self_attn.q_proj.weight", "llama") == "language"


def test_the_families_that_need_torchvision_are_those_whose_processor_takes_a_video_processor():
    """NEEDS_TORCHVISION agrees with transformers: a processor with a video processor (which needs torchvision even
    for images), or one that is torchvision-only (a dummy class without it)."""
    import importlib.util

    import transformers
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    from ftune.models.vision_parts import NEEDS_TORCHVISION

    has_torchvision = importlib.util.find_spec("torchvision") is not None
    for model_type in LAYOUTS:
        cls = getattr(transformers, PROCESSOR_MAPPING_NAMES[model_type])
        try:
            needs = "video_processor" in cls.get_attributes()
        except ImportError as err:  # the dummy of a torchvision-only processor
            assert "Torchvision" in str(err)
            needs = True
        if has_torchvision and model_type == "mistral3":  # Pixtral's is torchvision-only: no dummy to tell by
            continue
        assert needs == (model_type in NEEDS_TORCHVISION), model_type
