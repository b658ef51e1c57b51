"""`train.rl.generation.backend: paged`: the cache the Plan sizes for transformers' continuous batching, and the
completions it generates. Greedy completions from the paged path (generate_batch with the Plan's cache config,
what TRL calls) equal the padded batch's `generate` (TRL's regular path) token for token, on the tiny model, bare
and with a LoRA adapter on it (TRL generates from the PeftModel)."""

from __future__ import annotations

import pytest

from ftune.plan.paged import generation_batch, kv_bytes
from ftune.recipe.schema import Recipe
from ftune.tiny import WORDS


def recipe(backend: str = "paged", batch: int = 8, accumulation: int = 2, completion: int = 40, **data) -> Recipe:
    return Recipe.model_validate({
        "name": "paged", "model": {"path": "m"},
        "data": {"train": [{"path": "p.jsonl", "format": "prompt"}], **data},
        "train": {"objective": "grpo", "per_device_batch_size": batch, "gradient_accumulation_steps": accumulation,
                  "rl": {"rewards": [{"name": "exact_match"}], "num_generations": 4,
                         "max_completion_length": completion, "generation": {"backend": backend}}}})


def test_the_paged_cache_holds_every_completion_of_a_process_batch_in_whole_pages():
    b = generation_batch(recipe(max_prompt_length=24))
    assert (b.completions, b.row_tokens) == (16, 64)
    assert b.page_size == 64 and b.num_blocks == 16  # one 64-token page per request
    assert b.continuous_batching_config() == {"page_size": 64, "num_blocks": 16, "max_batch_tokens": 1024}
    long = generation_batch(recipe(max_prompt_length=500))  # 540 tokens: 3 pages of 256 each
    assert (long.page_size, long.num_blocks, long.cache_tokens) == (256, 48, 48 * 256)
    assert long.continuous_batching_config()["max_batch_tokens"] == 8192
    unset = generation_batch(recipe())
    assert unset.prompt_assumed and unset.prompt_tokens == 256
    plain = generation_batch(recipe("transformers", max_prompt_length=24))
    assert plain.page_size is None and plain.cache_tokens == 16 * 64
    assert kv_bytes(layers=2, kv_heads=2, head_dim=16, itemsize=2, tokens=10) == 2 * 2 * 2 * 16 * 2 * 10


def test_the_plan_hands_trl_continuous_batching_with_its_cache():
    from ftune.plan.rl import config_kwargs

    kw = config_kwargs(recipe(max_prompt_length=24))
    assert kw["use_transformers_continuous_batching"] is True and kw["use_vllm"] is False
    assert kw["transformers_continuous_batching_config"]["num_blocks"] == 16
    assert "use_transformers_continuous_batching" not in config_kwargs(recipe("transformers"))


@pytest.mark.parametrize("lora", [pytest.param(False, marks=pytest.mark.extended), True])
def test_greedy_completions_are_the_same_paged_and_padded(tiny_model_dir, lora):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.generation import ContinuousBatchingConfig

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 init_lora_weights=False))  # a non-zero adapter changes the output
    model.eval()
    prompts = [tok(f"Q: {' '.join(WORDS[(3 * i + k) % len(WORDS)] for k in range(1 + i % 5))}\nA:")["input_ids"]
               for i in range(8)]  # lengths differ: the padded batch is left-padded, the paged one is not
    new = 16
    plan = generation_batch(recipe(batch=len(prompts), accumulation=1, completion=new,
                                   max_prompt_length=max(map(len, prompts))))
    config = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=tok.eos_token_id,
                              pad_token_id=tok.pad_token_id)
    with torch.no_grad():
        out = model.generate_batch(prompts, generation_config=config, progress_bar=False,
                                   continuous_batching_config=ContinuousBatchingConfig(
                                       **plan.continuous_batching_config()))
        paged = [out[f"req_{i}"].generated_tokens for i in range(len(prompts))]
        width = max(map(len, prompts))
        ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        rows = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, width:].tolist()
    padded = [r[:r.index(tok.eos_token_id) + 1] if tok.eos_token_id in r else r for r in rows]  # then pads
    assert sum(map(len, paged)) > len(prompts) * 4  # real completions, not all cut at once
    for i, (a, b) in enumerate(zip(paged, padded)):
        assert a == b, (i, len(prompts[i]), a, b)


# ------------------------------------------------------------------------------ refused where it can't run, located
def test_paged_is_refused_located_where_continuous_batching_cannot_run(tmp_path):
    from tests.unit.test_rl import grpo, line_of, problems

    paged = {"backend": "paged"}
    p = problems(tmp_path, grpo(generation={**paged, "vllm_gpu_memory_utilization": 0.5}))
    assert list(p) == ["train.rl.generation.vllm_gpu_memory_utilization"]
    assert "backend is paged" in p["train.rl.generation.vllm_gpu_memory_utilization"].message
    p = problems(tmp_path, grpo(generation=paged), peft={"method": "prefix", "num_virtual_tokens": 4})
    assert list(p) == ["train.rl.generation.backend"] and "prefix" in p["train.rl.generation.backend"].message
    assert line_of(p["train.rl.generation.backend"]) == "backend: paged"
    p = problems(tmp_path, grpo(generation=paged), model={"path": "m", "attn_implementation": "flex_attention"})
    assert list(p) == ["train.rl.generation.backend"] and "flex_attention" in p["train.rl.generation.backend"].message


def test_paged_on_a_model_with_linear_attention_layers_is_refused_on_the_meta_model():
    from types import SimpleNamespace

    from ftune.plan.checks.preflight import paged_layer_problems

    hybrid = SimpleNamespace(config=SimpleNamespace(layer_types=["linear_attention", "full_attention"]))
    dense = SimpleNamespace(config=SimpleNamespace(layer_types=["sliding_attention", "full_attention"]))
    [p] = paged_layer_problems(recipe(), hybrid)
    assert p.path == "train.rl.generation.backend" and "linear_attention" in p.message
    assert paged_layer_problems(recipe(), dense) == []
    assert paged_layer_problems(recipe("transformers"), hybrid) == []


def test_the_plans_kv_figure_is_the_cache_transformers_allocates(tiny_model_dir):
    """transformers' PagedAttentionCache built from the Plan's config holds the estimate's bytes (plus its two
    'trash' sectors, which hold nothing)."""
    import torch
    from transformers import AutoConfig
    from transformers.generation import ContinuousBatchingConfig
    from transformers.generation.continuous_batching.cache import PagedAttentionCache
    from transformers.generation.continuous_batching.distributed import DistributedHelper
    from transformers.generation.continuous_batching.initialization import resolve_continuous_batching_config

    from ftune.estimate.generation import generation_memory

    config = AutoConfig.from_pretrained(tiny_model_dir)
    r = recipe(max_prompt_length=24)
    est = generation_memory(r, config, "float32")
    cb = resolve_continuous_batching_config(
        config, ContinuousBatchingConfig(**generation_batch(r).continuous_batching_config()), None, False,
        device=torch.device("cpu"))
    cache = PagedAttentionCache(config, cb, device="cpu", distributed_helper=DistributedHelper(None, None),
                                dtype=torch.float32)
    held = cache.cache_tensor.numel() - 2 * cache.bytes_per_sector
    assert est.bytes == held and cache.num_blocks == generation_batch(r).num_blocks


def test_weights_cast_by_trls_paged_path_are_put_back_bit_for_bit():
    """TRL's continuous-batching path runs `model.to(bfloat16)` under bf16 mixed precision and leaves it so; the
    worker holds the float32 weights and buffers across generation and puts them back unchanged."""
    from types import SimpleNamespace

    import torch

    from ftune.runtime.precision import hold_weights, put_back

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    model.register_buffer("inv_freq", torch.rand(4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = list(model.parameters())
    held = hold_weights(model, SimpleNamespace(bf16=True, fp16=False))
    model.to(torch.bfloat16)  # what TRL does before generate_batch
    assert model[0].weight.dtype == torch.bfloat16
    put_back(held)
    after = model.state_dict()
    assert all(after[k].dtype == torch.float32 and torch.equal(after[k], before[k]) for k in before)
    assert list(model.parameters()) == params  # the optimizer's Parameter objects, still
    assert hold_weights(model, SimpleNamespace(bf16=False, fp16=False)) is None
