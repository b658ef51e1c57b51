"""Tiny vision-language models built offline from configs with their processors, for the tests' colour task and the
benchmarks: LLaVA-NeXT, Gemma 3, PaliGemma and Mllama, whose processor works without torchvision (LLaVA and Idefics3
are in `ftune.tiny`), and the Qwen-VL families, whose processor needs it (`build_tiny_qwen_vl`). Each saves a folder
AutoProcessor and AutoModelForImageTextToText load.

The weights' init std is 0.2 (not transformers' 0.02) where the family takes it, so that a LoRA under a frozen
random head can move the logits far enough to learn in a few dozen steps, as for the tiny LLaVA.
"""

from __future__ import annotations

from pathlib import Path

from ftune.tiny import VLM_TEMPLATE, VLM_TOKENS

INIT_RANGE = 0.2


def _text(tokenizer, hidden_size: int, num_layers: int, **extra) -> dict:
    """A small decoder's config for the language model."""
    return dict(vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=num_layers,
                num_attention_heads=4, num_key_value_heads=2, intermediate_size=2 * hidden_size,
                max_position_embeddings=512, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False, initializer_range=INIT_RANGE, **extra)


def _siglip(image_size: int, patch_size: int, vision_size: int) -> dict:
    return dict(hidden_size=vision_size, num_hidden_layers=1, num_attention_heads=2, intermediate_size=2 * vision_size,
                image_size=image_size, patch_size=patch_size)


def _save(folder: str | Path, config, processor, tokenizer, init=None):
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_config(config)
    if init is not None:
        init(model)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(folder))
    processor.save_pretrained(str(folder))
    return model


def build_tiny_llava_next(folder: str | Path, tokenizer, *, image_size: int = 28, patch_size: int = 14,
                          hidden_size: int = 64, vision_size: int = 32, num_layers: int = 2, seed: int = 0):
    """A LLaVA-NeXT (CLIP tower, projector, `image_newline`, Llama): an image is its base view plus the tiles of
    the best grid resolution (one grid here, `image_size` square), each (image_size / patch_size)^2 tokens, with a
    newline token per row of tiles' patches."""
    import torch
    from transformers import LlavaNextConfig, LlavaNextImageProcessorPil, LlavaNextProcessor

    torch.manual_seed(seed)
    tokenizer.add_special_tokens({"additional_special_tokens": VLM_TOKENS})
    tokenizer.eos_token = "<|im_end|>"
    grid = [[image_size, image_size]]
    images = LlavaNextImageProcessorPil(size={"shortest_edge": image_size}, image_grid_pinpoints=grid,
                                        crop_size={"height": image_size, "width": image_size})
    processor = LlavaNextProcessor(image_processor=images, tokenizer=tokenizer, chat_template=VLM_TEMPLATE,
                                   patch_size=patch_size, vision_feature_select_strategy="default",
                                   num_additional_image_tokens=1)
    config = LlavaNextConfig(
        vision_config=dict(model_type="clip_vision_model", hidden_size=vision_size, num_hidden_layers=1,
                           num_attention_heads=2, intermediate_size=2 * vision_size, image_size=image_size,
                           patch_size=patch_size, projection_dim=vision_size),
        text_config=dict(model_type="llama", **_text(tokenizer, hidden_size, num_layers)),
        image_grid_pinpoints=grid, initializer_range=INIT_RANGE,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"), vision_feature_select_strategy="default",
        vision_feature_layer=-1, tie_word_embeddings=False)
    return _save(folder, config, processor, tokenizer)


def build_tiny_gemma3(folder: str | Path, tokenizer, *, image_size: int = 28, patch_size: int = 14,
                      hidden_size: int = 64, vision_size: int = 32, num_layers: int = 2, seed: int = 0):
    """A Gemma 3 (SigLIP tower, pooling projector, Gemma 3 decoder): the chat template's `<start_of_image>` is
    expanded by the processor into `\\n\\n<start_of_image>` + `mm_tokens_per_image` soft tokens +
    `<end_of_image>\\n\\n`."""
    import torch
    from transformers import AutoTokenizer, Gemma3Config, Gemma3ImageProcessorPil, Gemma3Processor

    torch.manual_seed(seed)
    extra = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    tokenizer.add_special_tokens({"additional_special_tokens": [*VLM_TOKENS, *extra.values()]})
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.save_pretrained(str(folder))  # reloaded with the named tokens Gemma3Processor reads (boi_token, ...)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), extra_special_tokens=extra)
    tokens = (image_size // patch_size) ** 2
    images = Gemma3ImageProcessorPil(size={"height": image_size, "width": image_size})
    processor = Gemma3Processor(image_processor=images, tokenizer=tokenizer,
                                chat_template=VLM_TEMPLATE.replace("<image>", "<start_of_image>"),
                                image_seq_length=tokens)
    config = Gemma3Config(
        vision_config=_siglip(image_size, patch_size, vision_size),
        text_config=_text(tokenizer, hidden_size, num_layers, head_dim=16, sliding_window=512,
                          query_pre_attn_scalar=16),
        mm_tokens_per_image=tokens, boi_token_index=tokenizer.convert_tokens_to_ids(extra["boi_token"]),
        eoi_token_index=tokenizer.convert_tokens_to_ids(extra["eoi_token"]),
        image_token_index=tokenizer.convert_tokens_to_ids(extra["image_token"]), initializer_range=INIT_RANGE,
        tie_word_embeddings=False)
    return _save(folder, config, processor, tokenizer)


PALIGEMMA_TEMPLATE = VLM_TEMPLATE.replace("<|im_end|>\n", "<|im_end|>")
"""PaliGemma's processor appends a newline to the text: turns that end with a special token keep the tokens of the
rendered text the processor's (no `\\n\\n` merged across the end)."""


def build_tiny_paligemma(folder: str | Path, tokenizer, *, image_size: int = 28, patch_size: int = 14,
                         hidden_size: int = 64, vision_size: int = 32, num_layers: int = 2, seed: int = 0):
    """A PaliGemma (SigLIP tower, linear projector, Gemma 2 decoder): the processor expands `<image>` into
    (image_size / patch_size)^2 image tokens and puts the BOS token after the last one."""
    import torch
    from transformers import PaliGemmaConfig, PaliGemmaProcessor, SiglipImageProcessorPil

    torch.manual_seed(seed)
    tokenizer.add_special_tokens({"additional_special_tokens": VLM_TOKENS})
    tokenizer.eos_token = "<|im_end|>"
    tokens = (image_size // patch_size) ** 2
    images = SiglipImageProcessorPil(size={"height": image_size, "width": image_size})
    images.image_seq_length = tokens
    processor = PaliGemmaProcessor(image_processor=images, tokenizer=tokenizer, chat_template=PALIGEMMA_TEMPLATE)
    config = PaliGemmaConfig(
        vision_config=dict(_siglip(image_size, patch_size, vision_size), projection_dim=hidden_size),
        text_config=dict(model_type="gemma2", **_text(tokenizer, hidden_size, num_layers, head_dim=16)),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"), projection_dim=hidden_size,
        hidden_size=hidden_size)
    return _save(folder, config, processor, tokenizer)


def build_tiny_mllama(folder: str | Path, tokenizer, *, seed: int = 0, **sizes):
    """A Mllama (Llama 3.2 Vision: a tiled ViT with a global encoder, a linear projector, and a Llama decoder with
    a gated cross-attention layer after the self-attention ones): the image is not in the sequence; its one
    `<|image|>` token starts the text that attends to the image's tiles (`cross_attention_mask`), and the processor
    puts the BOS token after the leading image tokens. One tile of `image_size` square (`mllama_parts`' sizes)."""
    import torch

    config, processor = mllama_parts(tokenizer, **sizes)
    torch.manual_seed(seed)
    return _save(folder, config, processor, tokenizer, init=_open_gates)


def mllama_parts(tokenizer, *, image_size: int = 28, patch_size: int = 14, hidden_size: int = 64,
                 vision_size: int = 32, num_layers: int = 2):
    """The tiny Mllama's config and processor (the tokenizer gets `<|image|>`)."""
    from transformers import MllamaConfig, MllamaImageProcessorPil, MllamaProcessor

    tokenizer.add_special_tokens({"additional_special_tokens": [*VLM_TOKENS, "<|image|>"]})
    tokenizer.eos_token = "<|im_end|>"
    images = MllamaImageProcessorPil(size={"height": image_size, "width": image_size}, max_image_tiles=1)
    processor = MllamaProcessor(image_processor=images, tokenizer=tokenizer,
                                chat_template=VLM_TEMPLATE.replace("<image>", "<|image|>"))
    config = MllamaConfig(
        vision_config=dict(hidden_size=vision_size, num_hidden_layers=2, num_global_layers=1, attention_heads=2,
                           intermediate_size=2 * vision_size, vision_output_dim=2 * vision_size,
                           image_size=image_size, patch_size=patch_size, max_num_tiles=1,
                           intermediate_layers_indices=[0], supported_aspect_ratios=[[1, 1]],
                           initializer_range=INIT_RANGE),
        text_config=_text(tokenizer, hidden_size, num_layers + 1, cross_attention_layers=[num_layers]),
        image_token_index=tokenizer.convert_tokens_to_ids("<|image|>"), tie_word_embeddings=False)
    return config, processor


def _open_gates(model) -> None:
    """Mllama's cross-attention gates start at 0 (tanh(0): no image in the text), and a pretrained checkpoint's are
    open: set to 1 here, since LoRA trains no gate."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("cross_attn_attn_gate", "cross_attn_mlp_gate")):
                p.fill_(1.0)


QWEN_VISION_TOKENS = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]
QWEN_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
"""The Qwen-VL families `build_tiny_qwen_vl` builds (Qwen3-VL-MoE is Qwen3-VL with a MoE decoder: not built here)."""


def build_tiny_qwen2_vl(folder: str | Path, tokenizer, **kwargs):
    """A tiny Qwen2-VL (`build_tiny_qwen_vl(family="qwen2_vl")`)."""
    return build_tiny_qwen_vl(folder, tokenizer, family="qwen2_vl", **kwargs)


def build_tiny_qwen_vl(folder: str | Path, tokenizer, *, family: str = "qwen2_vl", image_size: int = 28,
                       patch_size: int = 14, hidden_size: int = 64, vision_size: int = 32, num_layers: int = 2,
                       seed: int = 0):
    """A tiny Qwen-VL of `family` (Qwen2-VL: its ViT with 2D RoPE; Qwen2.5-VL: windowed attention, RMSNorm, a
    gated MLP; Qwen3-VL: learned position embeddings interpolated per image and DeepStack features added to the
    first decoder layers), the patch merger as projector and a Qwen2/Qwen3 decoder with M-RoPE: an image of
    `image_size` square becomes `<|vision_start|>` + (image_size / patch_size / 2)^2 `<|image_pad|>` tokens +
    `<|vision_end|>`. transformers 5.23 builds the processor only with a video processor, which needs torchvision
    (`make test-torchvision` makes a venv with it): without it this raises ImportError before writing anything."""
    import transformers

    config, images = qwen_vl_parts(tokenizer, family=family, image_size=image_size, patch_size=patch_size,
                                   hidden_size=hidden_size, vision_size=vision_size, num_layers=num_layers)
    video_class = "Qwen3VLVideoProcessor" if family == "qwen3_vl" else "Qwen2VLVideoProcessor"
    processor_class = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor",
                       "qwen3_vl": "Qwen3VLProcessor"}[family]
    videos = getattr(transformers, video_class)(**qwen_sizes(image_size, patch_size))  # raises without torchvision
    processor = getattr(transformers, processor_class)(
        image_processor=images, tokenizer=tokenizer, video_processor=videos,
        chat_template=VLM_TEMPLATE.replace("<image>", "".join(QWEN_VISION_TOKENS[:3])))
    import torch

    torch.manual_seed(seed)
    return _save(folder, config, processor, tokenizer)


def qwen_sizes(image_size: int, patch_size: int) -> dict:
    """Qwen-VL's image (and video) processor settings: images from one merged patch ((patch_size x 2)² pixels, one
    `<|image_pad|>`) up to `image_size` square (dynamic resolution: a larger image takes more tokens)."""
    return dict(size={"shortest_edge": (2 * patch_size) ** 2, "longest_edge": image_size * image_size},
                patch_size=patch_size, merge_size=2, temporal_patch_size=2)


def qwen2_vl_parts(tokenizer, **kwargs):
    """The tiny Qwen2-VL's config and image processor (`qwen_vl_parts(family="qwen2_vl")`)."""
    return qwen_vl_parts(tokenizer, family="qwen2_vl", **kwargs)


def qwen_vl_parts(tokenizer, *, family: str = "qwen2_vl", image_size: int = 28, patch_size: int = 14,
                  hidden_size: int = 64, vision_size: int = 32, num_layers: int = 2):
    """A tiny Qwen-VL's config and image processor (both work without torchvision; the tokenizer gets the vision
    tokens): what `build_tiny_qwen_vl` saves beside the processor."""
    import transformers
    from transformers import Qwen2VLImageProcessorPil

    tokenizer.add_special_tokens({"additional_special_tokens": [*VLM_TOKENS, *QWEN_VISION_TOKENS]})
    tokenizer.eos_token = "<|im_end|>"
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in
           (("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"),
            ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"))}
    vision = dict(depth=1, num_heads=2, patch_size=patch_size, spatial_merge_size=2, temporal_patch_size=2,
                  initializer_range=INIT_RANGE)
    # M-RoPE: the head's rotary pairs (head_dim / 2 = 8) split over time, height and width
    rope = {"rope_type": "default", "mrope_section": [2, 3, 3] if family == "qwen3_vl" else [2, 2, 4]}
    if family == "qwen2_vl":
        vision |= dict(embed_dim=vision_size, hidden_size=hidden_size, mlp_ratio=2)
    elif family == "qwen2_5_vl":  # one full-attention block, windows of the whole image: the tiny image is one window
        vision |= dict(hidden_size=vision_size, intermediate_size=2 * vision_size, out_hidden_size=hidden_size,
                       window_size=image_size * 4, fullatt_block_indexes=[0])
    elif family == "qwen3_vl":  # a 4x4 grid of learned positions; DeepStack adds the one block's features
        vision |= dict(hidden_size=vision_size, intermediate_size=2 * vision_size, out_hidden_size=hidden_size,
                       num_position_embeddings=16, deepstack_visual_indexes=[0])
        rope |= {"mrope_interleaved": True}
    else:
        raise ValueError(f"no tiny builder for {family!r}: one of {', '.join(QWEN_FAMILIES)}")
    text = _text(tokenizer, hidden_size, num_layers, head_dim=hidden_size // 4, rope_parameters=rope)
    config_class = {"qwen2_vl": "Qwen2VLConfig", "qwen2_5_vl": "Qwen2_5_VLConfig", "qwen3_vl": "Qwen3VLConfig"}[family]
    config = getattr(transformers, config_class)(vision_config=vision, text_config=text,
                                                 initializer_range=INIT_RANGE, tie_word_embeddings=False, **ids)
    return config, Qwen2VLImageProcessorPil(**qwen_sizes(image_size, patch_size))
