"""`ftune plan` on a vision-language recipe: trainable parameters per part under `peft.modules`, the image tokens
from `data.images.max_pixels`, the image encoder's activations in the memory table, the text and JSON output."""

from __future__ import annotations

import json

import pytest

from ftune.cli.main import main
from ftune.estimate.estimate import estimate
from ftune.recipe.schema import Recipe

# A shrunken Qwen2.5-VL: the real class and layout, small sizes (patch 14, merge 2 as the real one).
TINY = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
        "text_config": {"model_type": "qwen2_5_vl_text", "hidden_size": 64, "intermediate_size": 128,
                        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                        "vocab_size": 1000, "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}},
        "vision_config": {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                          "out_hidden_size": 64, "patch_size": 14, "spatial_merge_size": 2,
                          "fullatt_block_indexes": [1]},
        "tie_word_embeddings": False}
VISION = 2 * 3 * 14 * 14 * 32 + 2 * (2 * 32 + (32 * 96 + 96) + (32 * 32 + 32) + 2 * (32 * 64 + 64) + (64 * 32 + 32))
PROJECTOR = 32 + (128 * 128 + 128) + (128 * 64 + 64)
QV = [(64, 64), (64, 32)]  # the default target_modules, q_proj and v_proj, in the language model
VISION_LINEARS = [(32, 96), (32, 32), (32, 64), (32, 64), (64, 32)]  # qkv, proj, gate, up, down per block


def recipe(tmp_path, modules=None, max_pixels=56 * 56, seq=64, train=None, targets=None) -> Recipe:
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    lora = {"method": "lora", **({"modules": modules} if modules else {}),
            **({"target_modules": targets} if targets else {})}
    return Recipe.model_validate({
        "name": "t", "model": {"path": "acme/tiny-vl", "config": str(tmp_path), "task": "image-text-to-text",
                               "dtype": "float32"},
        "peft": lora, "data": {"train": [{"path": "d.jsonl", "format": "vision-chat"}], "max_seq_length": seq,
                               "images": {"max_pixels": max_pixels}},
        "train": {"per_device_batch_size": 2, **(train or {})}})


def plan(r: Recipe):
    return estimate(r, world_size=1, num_processes=1, gpu_memory=None, device="cpu")


def test_defaults_freeze_the_tower_train_the_projector_and_lora_the_language_model(tmp_path):
    est = plan(recipe(tmp_path))
    parts = est.vision.parts
    assert {p: (c.params, c.mode) for p, c in parts.items()} == {
        "vision": (VISION, "frozen"), "projector": (PROJECTOR, "full"),
        "language": (1000 * 64 * 2 + 2 * (64 * 64 * 2 + 64 * 32 * 2 + 64 + 2 * 32 + 3 * 64 * 128 + 2 * 64) + 64,
                     "lora")}
    lora = 2 * sum(8 * (a + b) for a, b in QV)  # r = 8 on q_proj and v_proj of the 2 decoder layers
    assert (parts["vision"].trainable, parts["projector"].trainable, parts["language"].trainable) == (0, PROJECTOR,
                                                                                                       lora)
    assert est.params_trainable == PROJECTOR + lora
    # peft holds a `full` part twice, the original and its trained copy (modules_to_save): the weights count both
    assert est.params_total == sum(c.params for c in parts.values()) + lora + PROJECTOR


def _activations(est) -> int:
    return sum(i.bytes for i in est.memory if i.kind == "activations")


def test_image_encoder_activations_join_the_memory_table(tmp_path):
    """4 x 4 tokens (16 x 16 patches of 14 px) per image, 2 images a step: the tower keeps 17 x 32 x 4 bytes per
    patch per layer when it trains, the projector its input and hidden activations whenever anything before or in
    it trains; a frozen tower and projector keep nothing."""
    frozen = plan(recipe(tmp_path, {"vision": "frozen", "projector": "frozen", "language": "lora"},
                         targets="all-linear"))
    default = plan(recipe(tmp_path, targets="all-linear"))  # the language model's activations equal in all three
    tower = plan(recipe(tmp_path, {"vision": "lora", "projector": "full", "language": "lora"}, targets="all-linear"))
    image = default.vision.image
    assert (image.tokens, image.patches) == (4, 16)  # 56 x 56 px: 2 x 2 tokens of 28 px, 4 patches each
    patches, projector = 2 * 16, (2 * 2 * 16 * 32 + 2 * 4 * 64) * 4
    assert frozen.vision.encoder_activation_bytes == 0
    assert default.vision.encoder_activation_bytes == projector
    assert tower.vision.encoder_activation_bytes == 2 * patches * 17 * 32 * 4 + projector
    assert _activations(default) - _activations(frozen) == projector
    assert _activations(tower) - _activations(frozen) == tower.vision.encoder_activation_bytes
    checkpointed = plan(recipe(tmp_path, {"vision": "lora", "projector": "full", "language": "lora"},
                              train={"gradient_checkpointing": True}, targets="all-linear"))
    assert checkpointed.vision.encoder_activation_bytes == 2 * patches * 32 * 4 + projector  # each layer's input
    assert tower.vision.parts["vision"].trainable == 2 * sum(8 * (a + b) for a, b in VISION_LINEARS)


def test_image_tokens_beyond_the_row_are_said(tmp_path):
    est = plan(recipe(tmp_path, max_pixels=280 * 280, seq=64))  # 10 x 10 = 100 tokens in 64-token rows
    assert est.vision.image.tokens == 100
    assert ("vision: 1 image(s) of 100 tokens exceed the 64-token rows: lower data.images.max_pixels or raise "
            "data.max_seq_length") in est.notes


@pytest.fixture
def recipe_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    (tmp_path / "r.yaml").write_text(
        "name: t\nmodel:\n  path: acme/tiny-vl\n  config: config.json\n  task: image-text-to-text\n"
        "  dtype: float32\ndata:\n  train: [{path: d.jsonl, format: vision-chat}]\n  max_seq_length: 64\n"
        "  images: {max_pixels: 3136}\ntrain:\n  max_steps: 2\n")
    return tmp_path / "r.yaml"


def test_plan_prints_the_parts_and_the_image_cost(recipe_file, capsys):
    assert main(["plan", str(recipe_file), "--gpu-memory", "80GiB"]) == 0
    out = capsys.readouterr().out
    assert f"parts        vision {VISION:,} frozen (0 trainable) · projector {PROJECTOR:,} full ({PROJECTOR:,} " \
           "trainable) · language" in out
    assert "images       4 tokens, 16 encoder patches per image (a square image of data.images.max_pixels 3,136: " \
           "2 x 2 tokens of (14 x 2)² pixels" in out
    assert main(["plan", str(recipe_file), "--gpu-memory", "80GiB", "--format", "json"]) == 0
    vision = json.loads(capsys.readouterr().out)["estimate"]["vision"]
    assert vision["parts"]["projector"] == {"params": PROJECTOR, "trainable": PROJECTOR, "mode": "full"}
    assert (vision["image"]["tokens"], vision["images_per_sample"]) == (4, 1)
