"""`ftune plan`'s estimate: parameter counts on the catalog configs, config resolution, errors, layout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ftune.errors import FtuneError, RecipeError
from ftune.estimate.estimate import estimate, parse_bytes
from ftune.models.meta import resolve_config
from ftune.recipe.schema import Recipe

REPO = Path(__file__).resolve().parents[2]
GiB = 1024**3

# Published parameter counts of the bases (model cards / peft's print_trainable_parameters).
BASE_PARAMS = {
    "meta-llama/Llama-2-7b-hf": 6_738_415_616,
    "meta-llama/Llama-2-13b-hf": 13_015_864_320,
    "meta-llama/Llama-2-70b-hf": 68_976_648_192,
    "meta-llama/Meta-Llama-3-8B": 8_030_261_248,
    "meta-llama/Meta-Llama-3-70B": 70_553_706_496,
    "mistralai/Mistral-7B-v0.1": 7_241_732_096,
    "Qwen/Qwen2.5-7B": 7_615_616_512,
}


def make(path: str, peft: dict | None = None, **sections) -> Recipe:
    data = {"name": "t", "model": {"path": path, "dtype": "bfloat16"},
            "data": {"train": [{"path": "d.jsonl"}], "max_seq_length": 128}}
    if peft:
        data["peft"] = peft
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return Recipe.model_validate(data)


def plan(recipe: Recipe, world: int = 1, gpu: int | None = 80 * GiB):
    return estimate(recipe, world_size=world, num_processes=world, gpu_memory=gpu, seq_length=64)


@pytest.mark.parametrize("model_id", sorted(BASE_PARAMS))
def test_catalog_configs_give_the_published_parameter_counts(model_id):
    est = plan(make(model_id, {"method": "full"}))
    assert est.params_total == BASE_PARAMS[model_id]
    assert est.params_trainable == BASE_PARAMS[model_id]
    assert est.config_source.startswith("catalog ")


def test_lora_on_llama2_7b_matches_peft_print_trainable_parameters():
    est = plan(make("meta-llama/Llama-2-7b-hf", {"method": "lora", "r": 8, "target_modules": ["q_proj", "v_proj"]}))
    assert (est.params_trainable, est.params_total) == (4_194_304, 6_742_609_920)
    assert len(est.matched_modules) == 64
    assert est.matched_modules[:2] == ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj"]


def test_lora_all_linear_skips_the_head():
    est = plan(make("meta-llama/Llama-2-7b-hf", {"method": "lora", "r": 16, "target_modules": "all-linear"}))
    # r * (in + out) per linear: 4 attention (4096+4096) + gate/up (4096+11008) + down (11008+4096), 32 layers
    per_layer = 16 * (4 * 8192 + 3 * 15104)
    assert est.params_trainable == 32 * per_layer == 39_976_960
    assert len(est.matched_modules) == 7 * 32
    assert not any("lm_head" in m for m in est.matched_modules)


@pytest.mark.parametrize(
    ("model_id", "kv_dim"),
    [("meta-llama/Llama-2-7b-hf", 4096), ("mistralai/Mistral-7B-v0.1", 8 * 128)],  # GQA: kv heads x head dim
)
def test_prefix_tuning_counts_virtual_tokens_per_layer_for_keys_and_values(model_id, kv_dim):
    est = plan(make(model_id, {"method": "prefix", "num_virtual_tokens": 20}))
    prefix = 20 * 32 * 2 * kv_dim
    assert est.params_trainable == prefix
    assert est.params_total == BASE_PARAMS[model_id] + prefix


def test_llama_adapter_counts_prompts_and_gates_of_the_top_layers():
    est = plan(make("meta-llama/Llama-2-7b-hf", {"method": "llama-adapter", "adapter_len": 10, "adapter_layers": 30}))
    assert est.params_trainable == 30 * (10 * 4096 + 1)
    assert est.params_total == BASE_PARAMS["meta-llama/Llama-2-7b-hf"] + 30 * (10 * 4096 + 1)
    assert len(est.matched_modules) == 30


def test_freeze_counts_only_matching_parameters():
    est = plan(make("meta-llama/Llama-2-7b-hf", {"method": "freeze", "trainable": [r"layers\.31\.", "lm_head"]}))
    layer = 4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096
    assert est.params_trainable == layer + 32000 * 4096
    assert est.params_total == BASE_PARAMS["meta-llama/Llama-2-7b-hf"]
    assert "lm_head.weight" in est.matched_modules and len(est.matched_modules) == 10


def test_unmatched_target_modules_list_the_linear_layers():
    with pytest.raises(RecipeError) as err:  # a problem at the key; the CLI locates it in the recipe
        plan(make("meta-llama/Llama-2-7b-hf", {"method": "lora", "target_modules": ["query", "value"]}))
    (p,) = err.value.problems
    assert p.path == "peft.target_modules" and "(query, value) matches no module" in p.message
    assert p.hint == ("the model's linear layers are: down_proj, gate_proj, k_proj, lm_head, o_proj, "
                              "q_proj, up_proj, v_proj")


def test_unknown_hub_id_says_how_to_plan_it():
    with pytest.raises(RecipeError) as err:
        resolve_config(make("someone/unknown-7b"))
    (p,) = err.value.problems
    assert p.path == "model.path" and "no config found for 'someone/unknown-7b'" in p.message
    assert p.hint.startswith("did you mean ")  # the closest catalog names, however far
    assert ("Otherwise set model.config to a local config.json of the model, or fetch it once "
            "(`hf download someone/unknown-7b config.json`)") in p.hint


def test_chat_variant_resolves_to_its_base_in_the_catalog():
    file, source = resolve_config(make("meta-llama/Llama-2-7b-chat-hf"))
    assert file.name == "meta-llama--Llama-2-7b-hf.json" and source == "catalog meta-llama--Llama-2-7b-hf.json"


def test_local_folder_wins(tiny_model_dir):
    est = plan(make(str(tiny_model_dir), {"method": "full"}))
    assert est.config_source == f"local {tiny_model_dir}"
    from transformers import AutoModelForCausalLM

    real = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert est.params_total == sum(p.numel() for p in real.parameters())


def test_offline_hf_cache_is_used_before_the_catalog(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    snap = cache / "models--acme--tiny" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (cache / "models--acme--tiny" / "refs").mkdir()
    (cache / "models--acme--tiny" / "refs" / "main").write_text("abc123")
    config = json.loads((REPO / "ftune/catalog/meta-llama--Llama-2-7b-hf.json").read_text())
    config.update(num_hidden_layers=2, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                  num_key_value_heads=4, vocab_size=1000)
    (snap / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    recipe = make("acme/tiny", {"method": "full"})
    file, source = resolve_config(recipe)
    assert source.startswith("hf-cache ") and file == snap / "config.json"
    layer = 4 * 256 * 256 + 3 * 256 * 512 + 2 * 256
    assert plan(recipe).params_total == 2 * layer + 2 * 1000 * 256 + 256


def test_fsdp_units_and_shard_per_rank():
    recipe = make("meta-llama/Llama-2-70b-hf", {"method": "full"},
                  distributed={"strategy": "fsdp", "num_processes": 8, "fsdp": {"sharding_strategy": "full_shard"}})
    est = plan(recipe, world=8)
    assert est.fsdp is not None
    assert est.fsdp.units == 81 and est.fsdp.unit_classes["LlamaDecoderLayer"] == 80
    assert est.fsdp.shard_ranks == 8
    assert est.fsdp.shard_bytes_per_rank == -(-BASE_PARAMS["meta-llama/Llama-2-70b-hf"] * 2 // 8)
    layer = 2 * (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192)
    assert est.fsdp.largest_unit_bytes == layer


def test_size_policy_wraps_modules_over_the_threshold():
    recipe = make("meta-llama/Llama-2-7b-hf", {"method": "full"},
                  distributed={"strategy": "fsdp", "num_processes": 2,
                               "fsdp": {"auto_wrap_policy": "size", "min_num_params": 100_000_000}})
    est = plan(recipe, world=2)
    # torch's size policy, bottom-up: each MLP (135M) is a unit; the attention left in a layer (67M) is not;
    # ModuleList is never wrapped, so the 32 attentions go up to LlamaModel (2.1B); embed_tokens and
    # lm_head (131M each) are units; the root unit is left with nothing
    assert est.fsdp.unit_classes == {"LlamaMLP": 32, "Embedding": 1, "LlamaModel": 1, "Linear": 1,
                                     "root (LlamaForCausalLM)": 1}
    assert est.fsdp.units == 36


def test_70b_full_does_not_fit_one_gpu_and_suggestions_quantify_the_fix():
    est = plan(make("meta-llama/Meta-Llama-3-70B", {"method": "full"}))
    assert est.fits is False and est.total_bytes > 80 * GiB
    assert est.largest[0].startswith("optimizer (AdamW (torch, fused))")
    assert any(s.startswith("use peft.method: lora") for s in est.suggestions)
    assert all("->" in s for s in est.suggestions)


def test_7b_qlora_fits_and_weights_are_four_bit():
    recipe = make("meta-llama/Llama-2-7b-hf", {"method": "lora", "target_modules": "all-linear"},
                  quantization={"bits": 4, "double_quant": True}, train={"gradient_checkpointing": True})
    est = plan(recipe, gpu=24 * GiB)
    weights = {i.detail: i.bytes for i in est.memory if i.kind == "weights"}
    assert set(weights) == {"nf4", "float32"}
    quantized = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)
    assert quantized // 2 < weights["nf4"] < quantized // 2 * 1.04  # packed 4-bit + ~3% constants
    assert weights["float32"] > 2 * 32000 * 4096 * 4  # k-bit preparation upcasts head, embeddings, norms
    assert est.fits is True


def test_parse_bytes():
    assert parse_bytes("80GiB") == parse_bytes("80GB") == parse_bytes("80g") == 80 * GiB
    assert parse_bytes("16384MiB") == 16 * GiB and parse_bytes("1024B") == 1024
    with pytest.raises(FtuneError, match="cannot read memory size"):
        parse_bytes("lots")


def test_plan_modules_import_nothing_heavy():
    code = ("import sys, ftune.cli.plan, ftune.estimate.estimate, ftune.estimate.memory; "
            "print(sorted(m for m in ('torch', 'transformers', 'peft', 'datasets', 'bitsandbytes', 'accelerate') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"


def activations(est) -> int:
    return sum(i.bytes for i in est.memory if i.kind == "activations")


def test_eager_attention_keeps_the_seq_by_seq_scores():
    kw = dict(world_size=1, num_processes=1, gpu_memory=80 * GiB, seq_length=256)
    sdpa = estimate(make("meta-llama/Llama-2-7b-hf", {"method": "lora"}), **kw)
    eager = estimate(make("meta-llama/Llama-2-7b-hf", {"method": "lora"}, model={"attn_implementation": "eager"}),
                     **kw)
    # per layer, batch x heads x seq x seq scores: at least the fp32 softmax output (4 B), at most that and
    # a bf16 copy (2 B); the probe itself is checked against real eager forwards in test_estimate_bytes.py
    scores = 32 * 32 * 256 * 256
    assert 4 * scores <= activations(eager) - activations(sdpa) <= 6 * scores


def test_models_the_probe_cannot_run_fall_back_to_the_formula(monkeypatch):
    import ftune.estimate.probe as probe

    def fail(*args, **kwargs):
        raise RuntimeError("data-dependent operator on meta")

    monkeypatch.setattr(probe, "probe_activations", fail)
    est = estimate(make("meta-llama/Llama-2-7b-hf", {"method": "full"}), world_size=1, num_processes=1,
                   gpu_memory=None, device="cuda", seq_length=1000)
    assert activations(est) == 32 * 1000 * 17 * 4096 * 2 + 1000 * 32000 * 4  # 34 B/token/hidden + log-probs
    assert "activation probe could not run this model on the meta device (RuntimeError)" in est.notes[0]


LLAMA2_7B_BF16 = BASE_PARAMS["meta-llama/Llama-2-7b-hf"] * 2


@pytest.mark.parametrize(("objective", "peft", "preference", "copy"), [
    ("dpo", {"method": "full"}, None, True),
    ("kto", {"method": "full"}, None, True),
    ("dpo", {"method": "full"}, {"reference": "precomputed"}, False),
    ("kto", {"method": "full"}, {"reference": "precomputed"}, False),
    ("orpo", {"method": "full"}, None, False),
    ("simpo", {"method": "full"}, None, False),
    ("dpo", {"method": "lora"}, None, False),
    ("sft", {"method": "full"}, None, False),
])
def test_full_fine_tuning_dpo_and_kto_count_the_frozen_reference_copy(objective, peft, preference, copy):
    train = {"objective": objective, "per_device_batch_size": 2} | ({"preference": preference} if preference else {})
    fmt = "unpaired-preference" if objective == "kto" else "preference" if objective != "sft" else "text"
    recipe = make("meta-llama/Llama-2-7b-hf", peft, train=train,
                  data={"train": [{"path": "d.jsonl", "format": fmt}]})
    base = plan(make("meta-llama/Llama-2-7b-hf", peft, train={"per_device_batch_size": 2}))
    est = plan(recipe)
    refs = [i for i in est.memory if i.kind == "weights" and "reference" in i.detail]
    weights = sum(i.bytes for i in base.memory if i.kind == "weights")
    if copy:  # the weights once more: the same bytes as the model's own, and the peak grows by exactly that
        assert [(i.detail, i.bytes) for i in refs] == [(f"{objective} reference (frozen copy)", LLAMA2_7B_BF16)]
        assert weights == LLAMA2_7B_BF16
        assert est.total_bytes == base.total_bytes + LLAMA2_7B_BF16
        tight = plan(recipe, gpu=48 * GiB).suggestions  # 62.8 GiB: over, so every saving is listed
        assert any(s.startswith("use train.preference.reference: precomputed (no reference copy in memory): peak "
                                "62.82 GiB -> 50.27 GiB") for s in tight), tight
    else:
        assert refs == [] and est.total_bytes == base.total_bytes


def test_the_reference_copy_is_sharded_like_the_model():
    fsdp = {"strategy": "fsdp", "num_processes": 8, "fsdp": {"sharding_strategy": "full_shard"}}
    recipe = make("meta-llama/Llama-2-7b-hf", {"method": "full"}, distributed=fsdp,
                  train={"objective": "dpo"}, data={"train": [{"path": "d.jsonl", "format": "preference"}]})
    refs = [i.bytes for i in plan(recipe, world=8).memory if "reference" in i.detail]
    assert refs == [LLAMA2_7B_BF16 // 8]


def test_current_qwen3_2507_ids_plan_offline_with_their_exact_count():
    """`Qwen/Qwen3-4B-Instruct-2507` (every current LLaMA-Factory qwen3 example): Qwen3-4B's architecture with a
    262,144-token context; 4,022,468,096 parameters (tied embeddings), as a meta-device model of its config counts."""
    for model_id in ("Qwen/Qwen3-4B-Instruct-2507", "Qwen/Qwen3-4B-Thinking-2507"):
        est = plan(make(model_id, {"method": "full"}))
        assert est.params_total == 4_022_468_096 and est.config_source.startswith("catalog Qwen--Qwen3-4B-")


@pytest.mark.parametrize("model_id", ["mistralai/Mistral-Small-24B-Instruct-2501", "acme/zzz", "Qwen/Qwen9-1T"])
def test_an_unknown_id_always_gets_near_names_and_the_model_config_hint(model_id):
    with pytest.raises(RecipeError) as err:  # a problem at model.path, located by the caller
        plan(make(model_id, {"method": "full"}))
    (p,) = err.value.problems
    assert p.path == "model.path" and "did you mean " in p.hint and "set model.config" in p.hint
    if model_id.startswith(("mistralai/", "Qwen/")):  # the same org's entries come first
        assert p.hint.split("did you mean ")[1].startswith(model_id.split("/")[0] + "/")


@pytest.mark.parametrize("path", ["/abs/nowhere/model", "./rel/model", "~/models/x"])
def test_a_missing_local_folder_is_never_suggested_for_download(path):
    with pytest.raises(RecipeError) as err:
        plan(make(path, {"method": "full"}))
    (p,) = err.value.problems
    assert p.path == "model.path" and "check the folder" in p.hint and "download" not in p.hint
    assert ("relative to the working directory" in p.message) == path.startswith(".")
