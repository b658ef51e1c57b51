"""A vision-language model's layers under FSDP and activation checkpointing (#26), on the tiny LLaVA: the compiler
names both towers' layer classes for FSDP's wrap policy (accelerate would refuse the model's own
`_no_split_modules`, which list a CLIP text class the vision-only tower lacks), `ftune plan` shows the units, and
`train.gradient_checkpointing` checkpoints the vision encoder's layers as well as the language decoder's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml


def _recipe(folder: Path, vlm_dir: Path, **sections) -> Path:
    from PIL import Image

    Image.new("RGB", (28, 28), (200, 30, 30)).save(folder / "red.png")
    row = {"messages": [{"role": "user", "content": [{"type": "image", "image": "red.png"},
                                                     {"type": "text", "text": "what colour"}]},
                        {"role": "assistant", "content": "red"}]}
    (folder / "data.jsonl").write_text(json.dumps(row) + "\n")
    recipe = {"name": "vlm", "model": {"path": str(vlm_dir), "task": "image-text-to-text", "dtype": "float32"},
              "data": {"train": [{"path": "data.jsonl", "format": "vision-chat"}], "max_seq_length": 32},
              "peft": {"method": "lora", "target_modules": "all-linear"}, "train": {"max_steps": 1},
              "output": {"dir": str(folder / "run"), "report_to": ["none"]}} | sections
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _plan(path: Path):
    from ftune.plan.compile import compile_plan
    from ftune.recipe import load_recipe

    return compile_plan(load_recipe(str(path)), check_inputs=False)


def test_fsdp_wraps_the_vision_encoder_and_the_language_decoder_layers(tmp_path, vlm_dir, capsys):
    from ftune.models.meta import build_meta_model

    path = _recipe(tmp_path, vlm_dir, distributed={"strategy": "fsdp", "num_processes": 2})
    declared = build_meta_model(_plan(path).recipe)._no_split_modules
    assert "CLIPTextEmbeddings" in declared  # what accelerate would look for, and not find, on its own
    plan = _plan(path)
    wrap = "CLIPEncoderLayer,CLIPVisionEmbeddings,LlamaDecoderLayer"  # the declared classes present in the model
    assert plan.launch.accelerate_config["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"] == wrap
    assert plan.trainer["fsdp_config"]["transformer_layer_cls_to_wrap"] == wrap.split(",")

    from ftune.cli.main import main

    capsys.readouterr()
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "FSDP full_shard: 5 units (CLIPVisionEmbeddings x1, CLIPEncoderLayer x1, LlamaDecoderLayer x2, root" in out


def test_the_recipe_s_wrap_classes_win_and_a_text_model_keeps_its_own(tmp_path, vlm_dir, tiny_model_dir):
    path = _recipe(tmp_path, vlm_dir, distributed={"strategy": "fsdp", "num_processes": 2,
                                                   "fsdp": {"transformer_layer_cls": ["LlamaDecoderLayer"]}})
    assert _plan(path).launch.accelerate_config["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"] == \
        "LlamaDecoderLayer"
    text = {"name": "t", "model": {"path": str(tiny_model_dir)}, "data": {"train": [{"path": "t.jsonl"}]}, "train": {"max_steps": 1},
            "distributed": {"strategy": "fsdp", "num_processes": 2}, "output": {"dir": str(tmp_path / "t")}}
    (tmp_path / "t.jsonl").write_text('{"text": "hello"}\n')
    (tmp_path / "text.yaml").write_text(yaml.safe_dump(text))
    fsdp = _plan(tmp_path / "text.yaml").launch.accelerate_config["fsdp_config"]
    assert fsdp["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"
    path = _recipe(tmp_path, vlm_dir, distributed={"strategy": "fsdp", "num_processes": 2,
                                                   "fsdp": {"auto_wrap_policy": "size"}})
    assert "fsdp_transformer_layer_cls_to_wrap" not in _plan(path).launch.accelerate_config["fsdp_config"]


@pytest.mark.parametrize("vision", ["lora", "frozen"])
def test_gradient_checkpointing_covers_the_vision_tower(tmp_path, vlm_dir, vision):
    """The model the worker builds (load, then peft per `peft.modules`) checkpointed as the Trainer does it with
    the Plan's kwargs: every layer of both towers is flagged, and a step re-runs the vision encoder's layer in
    backward when the tower trains (its activations were not kept); a frozen tower runs once, without autograd."""
    import torch

    from ftune.runtime.model import load_model
    from ftune.worker.peft import apply_method
    from ftune.datastage.tokenizer import load_processor

    plan = _plan(_recipe(tmp_path, vlm_dir, train={"max_steps": 1, "gradient_checkpointing": True},
                         peft={"method": "lora", "target_modules": "all-linear",
                               "modules": {"vision": vision, "projector": "full", "language": "lora"}}))
    assert plan.activation_checkpointing == "trainer" and plan.trainer["activation_checkpointing"] is True
    processor = load_processor(plan)
    model, _ = apply_method(load_model(plan, processor.tokenizer), plan)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs=plan.trainer[
        "activation_checkpointing_kwargs"])  # what Trainer.train does with these TrainingArguments
    layers = {name: m for name, m in model.named_modules() if type(m).__name__ in ("CLIPEncoderLayer",
                                                                                  "LlamaDecoderLayer")}
    assert sorted(type(m).__name__ for m in layers.values()) == ["CLIPEncoderLayer", "LlamaDecoderLayer",
                                                                  "LlamaDecoderLayer"]
    assert all(m.gradient_checkpointing for m in layers.values())

    calls = {name: 0 for name in layers}
    for name, m in layers.items():  # the MLP inside the layer: the checkpoint wraps the layer's forward, not its hooks
        m.mlp.register_forward_pre_hook(lambda *_, name=name: calls.__setitem__(name, calls[name] + 1))
    from PIL import Image

    inputs = processor(text=["<image>what colour red"], images=[Image.new("RGB", (28, 28), (200, 30, 30))],
                       return_tensors="pt")
    model.train()
    out = model(**inputs, labels=inputs["input_ids"])
    out.loss.backward()
    # a checkpointed layer runs twice: forward, then recomputed in backward (its activations were not kept). A frozen
    # tower runs once, without autograd (ftune.worker.peft.without_autograd): nothing of it is kept or recomputed
    expected = {name: 1 if vision == "frozen" and "vision_tower" in name else 2 for name in layers}
    assert calls == expected, calls
    tower = [p for n, p in model.named_parameters() if "vision_tower" in n and p.requires_grad]
    assert bool(tower) == (vision == "lora") and all(p.grad is not None for p in tower)
    projector = [p for n, p in model.named_parameters() if "multi_modal_projector" in n and p.requires_grad]
    assert projector and all(p.grad is not None for p in projector)  # the tower's output still trains it
    assert torch.isfinite(out.loss)


def test_a_frozen_tower_that_holds_its_projector_runs_once_and_the_projector_trains():
    """Qwen2-VL's tower holds its projector (`visual.merger`): under `peft.method: full` with `vision: frozen` and
    checkpointing, the vision blocks run once (no autograd, nothing recomputed), the merger and the language model
    get gradients, and no vision parameter does."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from ftune.methods import full
    from ftune.worker.peft import without_autograd
    from tests.unit.test_vision_parts import CONFIGS

    config = AutoConfig.for_model("qwen2_vl", **CONFIGS["qwen2_vl"], image_token_id=299, vision_start_token_id=298,
                                  vision_end_token_id=297, video_token_id=296)
    torch.manual_seed(0)
    model = full.inject(AutoModelForImageTextToText.from_config(config), full.Config(modules={"vision": "frozen"}),
                        "image-text-to-text")
    assert without_autograd(model) == ["model.visual.blocks.0", "model.visual.patch_embed"]  # not the merger
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    calls: dict[str, int] = {}
    for name, m in model.named_modules():
        if type(m).__name__ in ("Qwen2VLVisionBlock", "Qwen2VLDecoderLayer"):
            m.mlp.register_forward_pre_hook(lambda *_, name=name: calls.__setitem__(name, calls.get(name, 0) + 1))
    ids = torch.tensor([[1, 2, 298, 299, 297, 3, 4]])  # one image: 2x2 patches merged into one token
    model.train()
    out = model(input_ids=ids, mm_token_type_ids=(ids == 299).long(), pixel_values=torch.randn(4, 3 * 2 * 14 * 14),
                image_grid_thw=torch.tensor([[1, 2, 2]]), labels=ids)
    out.loss.backward()
    assert calls == {"model.visual.blocks.0": 1, "model.language_model.layers.0": 2}, calls
    grads = {n: p.grad is not None for n, p in model.named_parameters()}
    assert all(grads[n] for n in grads if ".merger." in n or "language_model" in n)
    assert not any(grads[n] for n in grads if ".visual." in n and ".merger." not in n)
