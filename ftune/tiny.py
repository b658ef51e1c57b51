"""Tiny models and tokenizers built offline, for the demo, the tests and the benchmarks.

Nothing here downloads anything: the tokenizer is trained on the given texts and the model is
built from a config, then both are saved as a normal HF folder that `from_pretrained` loads.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]

CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 384,
          "max_position_embeddings": 512}
"""A tiny Llama's config.json alone (no weights): enough for the compiler's checks on the meta device."""

WORDS = (
    "the cat sat on a mat and the dog ran in the park while birds sang songs about rain sun wind "
    "people read books write code train models fine tune small networks learn fast answer questions"
).split()


def corpus(n: int = 400, seed: int = 0) -> list[str]:
    """A deterministic toy corpus (also used to train the tiny tokenizer)."""
    import random

    rng = random.Random(seed)
    lines = []
    for i in range(n):
        k = rng.randint(5, 20)
        lines.append(" ".join(rng.choice(WORDS) for _ in range(k)) + f" {i % 10} {rng.randint(0, 99)}.")
    return lines


def train_tokenizer(texts: Iterable[str], folder: str | Path, vocab_size: int = 512):
    """Train a byte-level BPE tokenizer on `texts` and save it (tokenizer.json + config) in `folder`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
    )
    fast.save_pretrained(str(folder))
    return fast


def build_tiny_llama(
    folder: str | Path,
    tokenizer,
    *,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_positions: int = 512,
    task: str = "causal-lm",
    labels: list[str] | None = None,
    seed: int = 0,
):
    """Build a randomly initialised Llama of the given shape and save it (with the tokenizer) in `folder`.

    Keep linear dimensions multiples of 32: bitsandbytes' 4-bit CPU kernels need that.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, LlamaConfig

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    if task == "sequence-classification":
        labels = labels or ["negative", "positive"]
        config.num_labels = len(labels)
        config.id2label = dict(enumerate(labels))
        config.label2id = {name: i for i, name in enumerate(labels)}
        model = AutoModelForSequenceClassification.from_config(config)
    else:
        model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return model


MOE_ARCHS = ("qwen3_moe", "mixtral", "qwen2_moe")
"""Tiny mixture-of-experts models `build_tiny_moe` builds: Qwen3-MoE, Mixtral, and Qwen2-MoE (shared experts)."""


def build_tiny_moe(
    folder: str | Path,
    tokenizer,
    *,
    arch: str = "qwen3_moe",
    hidden_size: int = 64,
    expert_size: int = 32,
    num_layers: int = 2,
    num_experts: int = 4,
    top_k: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_positions: int = 512,
    favour_expert: int | None = None,
    seed: int = 0,
):
    """Build a randomly initialised MoE causal LM (transformers' fused experts) and save it with the tokenizer.

    `favour_expert`: bias every router so that this expert takes every token (a collapsed router, for tests).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if arch not in MOE_ARCHS:
        raise ValueError(f"arch must be one of {MOE_ARCHS}")
    torch.manual_seed(seed)
    common = dict(
        vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False, num_experts_per_tok=top_k,
    )
    if arch == "mixtral":
        config = AutoConfig.for_model("mixtral", intermediate_size=expert_size, num_local_experts=num_experts,
                                      **common)
    else:
        extra = {"shared_expert_intermediate_size": expert_size} if arch == "qwen2_moe" else {}
        config = AutoConfig.for_model(arch, intermediate_size=expert_size, moe_intermediate_size=expert_size,
                                      num_experts=num_experts, head_dim=hidden_size // num_heads, **extra,
                                      **common)
    model = AutoModelForCausalLM.from_config(config)
    if favour_expert is not None:
        with torch.no_grad():
            model.get_input_embeddings().weight[:, 0] = 1.0  # every token's residual stream leans on dim 0
            for name, p in model.named_parameters():
                if name.endswith("mlp.gate.weight"):  # the router reads dim 0 only, for one expert
                    p.zero_()
                    p[favour_expert, 0] = 50.0
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return model


VLM_TOKENS = ["<|im_start|>", "<|im_end|>", "<image>"]
VLM_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}<image>{% elif p['type'] == 'text' %}"
    "{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""A chatml chat template that renders image parts as `<image>` (what LLaVA's processor expands)."""


def build_tiny_llava(folder: str | Path, tokenizer, *, image_size: int = 28, patch_size: int = 14,
                     hidden_size: int = 64, vision_size: int = 32, num_layers: int = 2, init_range: float = 0.2,
                     seed: int = 0):
    """A randomly initialised LLaVA (a CLIP vision tower, a projector, a Llama) with its processor (the given
    tokenizer with `<|im_start|>`, `<|im_end|>` and `<image>` added, a CLIP image processor at `image_size`,
    a chatml template that renders image parts), saved in `folder`: what AutoProcessor and
    AutoModelForImageTextToText load. An image becomes (image_size / patch_size)^2 tokens. `init_range`: the
    weights' init std; 0.2 (not transformers' 0.02) so that a LoRA under the frozen random head can move the
    logits far enough to learn in a few dozen steps."""
    import torch
    from transformers import AutoModelForImageTextToText, CLIPImageProcessor, LlavaConfig, LlavaProcessor

    torch.manual_seed(seed)
    tokenizer.add_special_tokens({"additional_special_tokens": VLM_TOKENS})
    tokenizer.eos_token = "<|im_end|>"
    images = CLIPImageProcessor(size={"shortest_edge": image_size},
                                crop_size={"height": image_size, "width": image_size})
    processor = LlavaProcessor(image_processor=images, tokenizer=tokenizer, chat_template=VLM_TEMPLATE,
                               patch_size=patch_size, vision_feature_select_strategy="default",
                               num_additional_image_tokens=1)
    config = LlavaConfig(
        vision_config=dict(model_type="clip_vision_model", hidden_size=vision_size, num_hidden_layers=1,
                           num_attention_heads=2, intermediate_size=2 * vision_size, image_size=image_size,
                           patch_size=patch_size, projection_dim=vision_size),
        text_config=dict(model_type="llama", vocab_size=len(tokenizer), hidden_size=hidden_size,
                         num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=2 * hidden_size, max_position_embeddings=512,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
                         initializer_range=init_range),
        initializer_range=init_range, image_token_id=tokenizer.convert_tokens_to_ids("<image>"), vision_feature_select_strategy="default",
        vision_feature_layer=-1, tie_word_embeddings=False,
    )
    model = AutoModelForImageTextToText.from_config(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(folder))
    processor.save_pretrained(str(folder))
    return model


def build_tiny_idefics3(folder: str | Path, tokenizer, *, image_size: int = 28, patch_size: int = 14,
                        hidden_size: int = 64, vision_size: int = 32, num_layers: int = 2, init_range: float = 0.02,
                        seed: int = 0):
    """A randomly initialised Idefics3 (SigLIP-style vision tower, pixel-shuffle connector, Llama) with its
    processor (the same chatml template; `<image>` rewritten by the processor into
    `<fake_token_around_image><global-img><image><fake_token_around_image>`: one image token per image, no
    splitting), saved in `folder`. The second family the tests train: its processor rewrites the placeholder
    instead of repeating it. `init_range`: the weights' init std (0.2 to learn the colour task in a few dozen
    steps through `ftune run`, as `build_tiny_llava`'s)."""
    import torch
    from transformers import AutoModelForImageTextToText, Idefics3Config, Idefics3ImageProcessor, Idefics3Processor

    torch.manual_seed(seed)
    tokenizer.add_special_tokens({"additional_special_tokens": [*VLM_TOKENS, "<fake_token_around_image>",
                                                                "<global-img>"]})
    tokenizer.eos_token = "<|im_end|>"
    images = Idefics3ImageProcessor(do_image_splitting=False, size={"longest_edge": image_size},
                                    max_image_size={"longest_edge": image_size})
    processor = Idefics3Processor(image_processor=images, tokenizer=tokenizer, chat_template=VLM_TEMPLATE,
                                  image_seq_len=((image_size // patch_size) // 2) ** 2)
    config = Idefics3Config(
        vision_config=dict(hidden_size=vision_size, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=2 * vision_size, image_size=image_size, patch_size=patch_size),
        text_config=dict(model_type="llama", vocab_size=len(tokenizer), hidden_size=hidden_size,
                         num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=2 * hidden_size, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         tie_word_embeddings=False, initializer_range=init_range),
        initializer_range=init_range, scale_factor=2, image_token_id=tokenizer.convert_tokens_to_ids("<image>"), tie_word_embeddings=False,
    )
    model = AutoModelForImageTextToText.from_config(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(folder))
    processor.save_pretrained(str(folder))
    return model
