"""The tiled loss (`train.tiled_loss`): each verified family's loss and gradients equal its own forward's (with
masked labels, the Trainer's `num_items_in_batch`, the head's transforms made to matter), a trainable head (full,
LoRA on `lm_head`) gets the same gradients, no-grad calls keep the model's logits, the slices, and the plan's
refusals and figures."""

from __future__ import annotations

import pytest

from ftune import tiled_loss

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=300, head_dim=16, pad_token_id=0, bos_token_id=1, eos_token_id=2)
TRANSFORMS = {"gemma2": {"final_logit_softcapping": 0.5}, "gemma3_text": {"final_logit_softcapping": 0.5},
              "granite": {"logits_scaling": 4.0}, "cohere": {"logit_scale": 3.0}}
"""Each family's head transform at a value that changes the loss (their defaults barely move a tiny model's)."""


def tiny(model_type: str, method: str = "full"):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **SMALL, **TRANSFORMS.get(model_type, {}))
    model = AutoModelForCausalLM.from_config(config)
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "lm_head"]))
        for name, p in model.named_parameters():
            if "lora_B" in name:  # nonzero, so every adapter's gradient is nonzero
                torch.nn.init.normal_(p, std=0.1)
    model.train()
    return model


def step(model, items=None):
    import torch

    ids = torch.randint(3, 300, (2, 23), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[0, :9] = -100  # a prompt masked out
    kwargs = {} if items is None else {"num_items_in_batch": torch.tensor(items)}
    loss = model(input_ids=ids, labels=labels, **kwargs).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def assert_same(reference, tiled, trainable: int):
    (loss, grads), (tiled_loss_value, tiled_grads) = reference, tiled
    assert tiled_loss_value == pytest.approx(loss, rel=1e-6)
    assert grads.keys() == tiled_grads.keys() and len(grads) == trainable
    for name, g in grads.items():
        assert (tiled_grads[name] - g).abs().max().item() <= 1e-6 * max(1.0, g.abs().max().item()), name


VISION = ("llava", "idefics3")
"""The verified vision-language families: tested with an image in the row (ftune.tiny builds them)."""
TEXT = tuple(t for t in tiled_loss.VERIFIED if t not in VISION)


def test_every_verified_family_is_tested():
    assert set(VISION) <= set(tiled_loss.VERIFIED) and len(TEXT) + len(VISION) == len(tiled_loss.VERIFIED)


@pytest.mark.parametrize("model_type", TEXT)
def test_each_verified_family_gives_its_own_loss_and_gradients(model_type):
    reference = step(tiny(model_type))
    model = tiny(model_type)
    assert tiled_loss.apply(model, 4) is True
    assert tiled_loss.apply(model, 4) is False  # once
    tiled = step(model)
    assert tiled[0] != pytest.approx(step(tiny(model_type), items=7)[0])  # the masked labels and items matter
    assert_same(reference, tiled, len(reference[1]))


def test_the_transforms_matter_so_the_families_test_them():
    import torch

    for model_type, values in TRANSFORMS.items():
        model = tiny(model_type)
        lm = tiled_loss.head(model)
        logits = torch.randn(3, 300) * 10
        assert not torch.allclose(tiled_loss.logit_transform(lm)(logits), logits), model_type
    assert tiled_loss.logit_transform(tiled_loss.head(tiny("llama")))(logits) is logits


@pytest.mark.parametrize("method", ["full", "lora"])
def test_the_trainers_item_count_and_a_trainable_head(method):
    """The Trainer passes the step's label tokens (`num_items_in_batch`): the loss is the sum over them; the head
    (full fine-tuning's `lm_head`, or a LoRA on it) trains through the slices."""
    reference = step(tiny("llama", method), items=11)
    model = tiny("llama", method)
    tiled_loss.apply(model, 5)
    tiled = step(model, items=11)
    assert any("lm_head" in name for name in tiled[1])
    assert_same(reference, tiled, len(reference[1]))


def test_compiled_the_tiled_loss_gives_the_same_loss_and_gradients():
    """`train.compile` with the tiled loss: torch.compile traces the checkpointed slices (aot_eager here; inductor
    needs a C compiler) and gives the model's own loss and gradients."""
    import torch

    reference = step(tiny("llama"))
    model = tiny("llama")
    tiled_loss.apply(model, 4)
    loss, grads = step(torch.compile(model, backend="aot_eager"))
    assert_same(reference, (loss, {k.removeprefix("_orig_mod."): g for k, g in grads.items()}), len(reference[1]))


def test_labels_get_the_tiled_loss_and_calls_without_them_the_models_logits():
    """Training and evaluation (labels, with or without grad) get the loss and no logits: an eval batch of long rows
    holds no logits either; generation and scoring (no labels) get the model's own forward and its logits."""
    import torch

    model = tiny("llama")
    ids = torch.randint(3, 300, (1, 9))
    with torch.no_grad():
        own = model(input_ids=ids, labels=ids).loss
    tiled_loss.apply(model, 4)
    with torch.no_grad():
        evaluated = model(input_ids=ids, labels=ids)
        assert evaluated.logits is None and evaluated.loss == pytest.approx(own.item(), rel=1e-6)
        assert model(input_ids=ids).logits.shape == (1, 9, 300)
    out = model(input_ids=ids, labels=ids)  # training: the loss, no logits
    assert out.logits is None and out.loss.requires_grad
    tiled_loss.remove(model)
    assert model(input_ids=ids, labels=ids).logits is not None


def test_the_tiled_forward_keeps_the_models_signature():
    """Generation validates its inputs against the forward's parameters (a VLM's `pixel_values`), and the Trainer
    picks the dataset columns it keeps from them: the tiled forward shows the model's own."""
    import inspect

    model = tiny("llama")
    own = inspect.signature(model.forward)
    tiled_loss.apply(model, 4)
    assert inspect.signature(model.forward) == own and "labels" in own.parameters


@pytest.mark.parametrize(("rule", "tokens", "hidden", "vocab", "want"),
                         [(4, 100, 64, 300, 4), ("auto", 100, 64, 300, 5), ("auto", 4096, 4096, 128256, 32),
                          ("auto", 3, 64, 300, 3), (8, 5, 64, 300, 5)])
def test_slices(rule, tokens, hidden, vocab, want):
    assert tiled_loss.shard_count(rule, tokens, hidden, vocab) == want


@pytest.fixture(scope="module")
def wide_vocab_dir(tmp_path_factory):
    """A 2-layer Llama with a vocabulary 64 x its hidden size (Llama-3-8B's is 31x): the head's logits are the step's
    largest tensors, as in a real model's long row."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("wide-vocab")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=4096)).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("shards", [None, "auto", 2])
def test_the_plans_backward_phase_is_a_real_steps_peak(wide_vocab_dir, shards):
    """The plan's backward phase against the counted peak of a real CPU step (the step probe's counter, as
    tests/unit/test_step_probe.py does), LoRA with checkpointing, on a model whose logits are the step's largest
    tensors: the tiled loss takes most of the step's peak away, and the plan says how much. In 2 slices the
    slice's recompute is still the peak: that checks the plan's count of a slice (its log-probs and gradients)."""
    from ftune.estimate.estimate import estimate
    from tests.unit.test_step_probe import recipe, real_step_peak

    tiling = {} if shards is None else {"tiled_loss": True, "tiled_loss_shards": None if shards == "auto" else shards}
    r = recipe(wide_vocab_dir, "lora", gradient_checkpointing=True, **tiling)
    est = estimate(r, world_size=1, num_processes=1, gpu_memory=None, device="cpu")
    backward = {i.detail: i.bytes for i in est.memory if i.phase == "backward"}
    real = real_step_peak(wide_vocab_dir, r, True, False, tiled_loss=shards)
    assert sum(backward.values()) == pytest.approx(real, rel=0.05), (backward, real)
    peak = {None: "head gradients (logits-sized)", 2: "one slice of the tiled loss recomputed in backward "
            "(train.tiled_loss)", "auto": "one layer recomputed in backward, its gradients in flight"}[shards]
    assert peak in backward, backward
    if shards == "auto":  # 64 slices: the layers' backward is the peak now
        untiled = real_step_peak(wide_vocab_dir, r, True, False)
        assert real < 0.5 * untiled, (real, untiled)


def recipe_problems(tmp_path, model_dir, **sections) -> dict:
    """The recipe-tier problems of a recipe with `sections` merged in (by top-level key)."""
    import yaml

    from ftune.errors import RecipeError
    from ftune.recipe import load_recipe

    raw = {"name": "t", "model": {"path": str(model_dir)}, "data": {"train": [{"path": "d.jsonl"}]},
           "train": {"max_steps": 2}}
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(raw))
    try:
        load_recipe(tmp_path / "r.yaml")
    except RecipeError as err:
        return {p.path: p for p in err.problems}
    return {}


def test_rules_refuse_what_the_tiled_loss_cannot_reach(tmp_path, tiny_model_dir):
    found = recipe_problems(tmp_path, tiny_model_dir, train={"tiled_loss_shards": 4})
    assert "train.tiled_loss is false" in found["train.tiled_loss_shards"].message
    found = recipe_problems(tmp_path, tiny_model_dir, train={"tiled_loss": True, "kernels": "liger"})
    assert "already computes the loss in chunks" in found["train.tiled_loss"].message
    found = recipe_problems(tmp_path, tiny_model_dir, train={"tiled_loss": True},
                            distributed={"strategy": "deepspeed", "num_processes": 2})
    assert "DeepSpeed" in found["train.tiled_loss"].message and "fsdp" in found["train.tiled_loss"].hint
    found = recipe_problems(tmp_path, tiny_model_dir, train={"tiled_loss": True, "objective": "dpo"},
                            data={"train": [{"path": "d.jsonl", "format": "preference"}]})
    assert "computes its loss from the model's logits in its trainer" in found["train.tiled_loss"].message
    found = recipe_problems(tmp_path, tiny_model_dir, train={"tiled_loss": True},
                            model={"task": "sequence-classification"})
    assert "language model's next-token loss" in found["train.tiled_loss"].message
    assert recipe_problems(tmp_path, tiny_model_dir, train={"tiled_loss": True, "tiled_loss_shards": 4}) == {}


def test_plan_records_the_slices_and_refuses_an_unverified_family(tmp_path, tiny_model_dir, tiny_qwen3_moe_dir):
    from tests.unit.test_tiled_mlp import plan_for, problems

    from ftune.plan.compile import compile_plan

    plan = compile_plan(plan_for(tmp_path, tiny_model_dir, tiled_loss=True), check_inputs=False)
    assert plan.tiled_loss_shards == "auto"
    # the tiny Llama: vocabulary 384 / hidden 64 -> 6 slices of a 64-token row
    assert "train.tiled_loss: the output head and loss in 6 slices of <= 11 tokens at 64 tokens a row" in \
        "\n".join(plan.notes)
    plan = compile_plan(plan_for(tmp_path, tiny_model_dir, tiled_loss=True, tiled_loss_shards=4), check_inputs=False)
    assert plan.tiled_loss_shards == 4 and any("in 4 slices of <= 16 tokens" in n for n in plan.notes)
    assert compile_plan(plan_for(tmp_path, tiny_model_dir), check_inputs=False).tiled_loss_shards is None
    found = problems(plan_for(tmp_path, tiny_qwen3_moe_dir, tiled_loss=True))
    assert "verified to give the same loss" in found["train.tiled_loss"].message
    assert "qwen3_moe" in found["train.tiled_loss"].message and "liger" in found["train.tiled_loss"].hint


def test_the_8b_plan_gains_what_liger_gains_and_stops_naming_liger():
    """Llama-3.1-8B (the catalog's config) LoRA at 4096 on a 141 GiB GPU: the tiled loss raises the longest row as
    Liger's fused cross-entropy does (32 slices: a slice's logits are small), and the "longer rows" note then starts
    at the next lever."""
    from tests.unit.test_tiled_mlp import estimate_8b as est

    plain, liger, tiled = est(), est(kernels="liger"), est(tiled_loss=True)
    assert tiled.total_bytes == pytest.approx(liger.total_bytes, rel=0.01) and tiled.total_bytes < plain.total_bytes
    [line] = [n for n in tiled.notes if n.startswith("longer rows")]
    assert line.split("in turn): ", 1)[1].startswith("+ train.activation_offloading")
    [cap] = [n for n in tiled.notes if n.startswith("longest row:")]
    [liger_cap] = [n for n in liger.notes if n.startswith("longest row:")]
    assert cap == liger_cap  # 202,781 tokens fit, capped at the model's 131,072 positions


def test_a_tight_cpu_plan_suggests_the_tiled_loss_where_the_recipe_could_take_it(wide_vocab_dir):
    """On a CPU the plan can't suggest Liger (CUDA only): where the head's logits are the step's peak it suggests
    the tiled loss, with the peak it would give, unless the recipe can't take it (a preference objective)."""
    from ftune.estimate.estimate import estimate
    from tests.unit.test_step_probe import recipe

    r = recipe(wide_vocab_dir, "lora", gradient_checkpointing=True)
    roomy = estimate(r, world_size=1, num_processes=1, gpu_memory=2**40, device="cpu")
    tight = estimate(r, world_size=1, num_processes=1, gpu_memory=int(roomy.total_bytes * 0.95), device="cpu")
    [line] = [s for s in tight.suggestions if s.startswith("use train.tiled_loss")]
    tiled = estimate(r.model_copy(update={"train": r.train.model_copy(update={"tiled_loss": True})}), world_size=1,
                     num_processes=1, gpu_memory=2**40, device="cpu")
    from ftune.estimate.memory import fmt_bytes

    assert line.endswith(f"-> {fmt_bytes(tiled.total_bytes)}"), (line, tiled.total_bytes)
    dpo = r.model_copy(update={"train": r.train.model_copy(update={"objective": "dpo"})})
    assert not [s for s in estimate(dpo, world_size=1, num_processes=1, gpu_memory=int(roomy.total_bytes * 0.95),
                                    device="cpu").suggestions if "tiled_loss" in s]


@pytest.mark.parametrize("family", VISION)
def test_a_vlms_loss_and_gradients_with_an_image_in_the_row(tmp_path, tiny_tokenizer_dir, family):
    """LLaVA and Idefics3 (SmolVLM's family): the image goes through the vision tower into the decoder as the model's
    own forward sends it; the tiled loss gives the same loss and gradients, the tower's and projector's included."""
    import numpy as np
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

    from ftune import tiny as builders

    folder = tmp_path / family
    getattr(builders, f"build_tiny_{family}")(folder, AutoTokenizer.from_pretrained(tiny_tokenizer_dir))
    processor = AutoProcessor.from_pretrained(folder)
    image = Image.fromarray((np.random.RandomState(0).rand(28, 28, 3) * 255).astype("uint8"))
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what colour"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "red"}]}]
    batch = processor(text=[processor.apply_chat_template(chat, tokenize=False)], images=[[image]], return_tensors="pt")
    labels = batch["input_ids"].clone()
    labels[:, :5] = -100

    def step(model):
        model.train()
        loss = model(**batch, labels=labels).loss
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    torch.manual_seed(0)
    reference = step(AutoModelForImageTextToText.from_pretrained(folder))
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(folder)
    assert model.config.model_type == family and tiled_loss.apply(model, 3)
    tiled = step(model)
    assert any("vision" in name for name in tiled[1])  # the tower trained through the same graph
    assert_same(reference, tiled, len(reference[1]))
