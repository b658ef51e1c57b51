"""The model catalog: exact parameter counts from the architecture, mirrors and variants, `model.config`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ftune.cli.main import main
from ftune.errors import RecipeError
from ftune.models import catalog
from ftune.estimate.estimate import estimate
from ftune.models.meta import _build, resolve_config
from ftune.recipe.schema import Recipe

CATALOG = Path(catalog.__file__).resolve().parent.parent / "catalog"


def make(path: str, **model) -> Recipe:
    return Recipe.model_validate({"name": "t", "model": {"path": path, "dtype": "bfloat16", **model},
                                  "peft": {"method": "full"},
                                  "data": {"train": [{"path": "d.jsonl"}], "max_seq_length": 128}})


def closed_form(cfg: dict) -> int:
    """Parameters of a decoder from its config: embeddings + layers (attention, MLP, norms) + final norm + head."""
    return _closed_form(cfg)[0]


def _closed_form(cfg: dict) -> tuple[int, int]:
    """(total parameters, parameters in the routed experts) from the config alone."""
    h, layers, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    kind = cfg["model_type"]
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or h // heads
    q, kv = heads * head_dim, cfg["num_key_value_heads"] * head_dim
    attention = h * q + 2 * h * kv + q * h  # q, k, v, o (Phi-3's fused qkv_proj holds the same)
    if kind == "qwen2":
        attention += q + 2 * kv  # q, k, v biases
    if kind in ("qwen3", "gemma3_text", "qwen3_moe"):
        attention += 2 * head_dim  # q_norm, k_norm over one head
    if kind == "olmoe":
        attention += q + kv  # q_norm, k_norm over all heads
    if kind == "gpt_oss":
        attention += q + 2 * kv + h + heads  # biases of q, k, v, o and one attention sink per head
    if kind == "deepseek_v2":  # multi-head latent attention (no query compression in -Lite)
        nope, rope, v, rank = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
        attention = h * heads * (nope + rope) + h * (rank + rope) + rank + rank * heads * (nope + v) + heads * v * h
    mlp = 3 * h * cfg["intermediate_size"]  # gate, up, down (Phi-3's fused gate_up_proj holds the same)
    experts = 0
    if kind == "mixtral":
        experts = layers * cfg["num_local_experts"] * mlp
        mlp = cfg["num_local_experts"] * mlp + h * cfg["num_local_experts"]  # the experts and the router
    if kind in ("qwen3_moe", "olmoe"):
        e, size = cfg["num_experts"], cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
        experts = layers * e * 3 * h * size
        mlp = e * 3 * h * size + e * h
    if kind == "gpt_oss":  # fused gate_up (E, h, 2I) and down (E, I, h), with biases; the router has a bias too
        e, size = cfg["num_local_experts"], cfg["intermediate_size"]
        per_layer = e * (h * 2 * size + 2 * size + size * h + h)
        experts, mlp = layers * per_layer, per_layer + e * h + e
    norms = (4 if kind.startswith("gemma") else 2) * h  # Gemma: pre/post norms around attention and MLP
    head = 0 if cfg["tie_word_embeddings"] else vocab * h
    total = vocab * h + layers * (attention + mlp + norms) + h + head
    if kind == "deepseek_v2":  # the first layer(s) dense; then routed experts, a router and the shared experts
        dense, e, size = cfg["first_k_dense_replace"], cfg["n_routed_experts"], cfg["moe_intermediate_size"]
        routed = e * 3 * h * size
        moe = routed + e * h + cfg["n_shared_experts"] * 3 * h * size
        experts = (layers - dense) * routed
        total += (layers - dense) * (moe - mlp)
    return total, experts


def config(model_id: str) -> dict:
    return json.loads(catalog.lookup(model_id)[1].read_text())


# Published totals (model cards, safetensors metadata), each also derived by `closed_form` from the config.
PUBLISHED = {
    "meta-llama/Llama-3.1-8B": 8_030_261_248,
    "Qwen/Qwen3-8B": 8_190_735_360,
    "mistralai/Mistral-7B-v0.3": 7_248_023_552,
    "microsoft/Phi-3-mini-4k-instruct": 3_821_079_552,
    "google/gemma-2-9b": 9_241_705_984,
}


@pytest.mark.parametrize("model_id", sorted(PUBLISHED))
def test_plan_counts_equal_the_architecture(model_id):
    est = estimate(make(model_id), world_size=1, num_processes=1, gpu_memory=80 * 1024**3, seq_length=64)
    assert est.config_source == f"catalog {model_id.replace('/', '--')}.json"
    assert est.params_total == closed_form(config(model_id)) == PUBLISHED[model_id]


def test_every_catalog_config_builds_to_its_closed_form_count():
    """All entries, 405B and Mixtral included: the meta-device build (no activation probe) in about a second."""
    counts = {}
    for model_id, file in catalog.entries().items():
        model, _, _ = _build(make(model_id), file)
        seen = {id(p): p.numel() for p in model.parameters()}  # tied weights once
        counts[model_id] = (sum(seen.values()), closed_form(json.loads(file.read_text())))
    assert {k: a for k, (a, b) in counts.items() if a != b} == {}
    assert counts["meta-llama/Llama-3.1-405B"][0] == 405_853_388_800
    assert counts["meta-llama/Llama-3.2-1B"][0] == 1_235_814_400  # tied head
    assert counts["mistralai/Mixtral-8x7B-v0.1"][0] == 46_702_792_704
    assert counts["google/gemma-3-1b-pt"][0] == 999_885_952
    assert len(counts) >= 49


def test_each_name_names_one_entry():
    assert len(catalog.by_name()) == len(catalog.entries())


@pytest.mark.parametrize(
    ("model_id", "entry"),
    [
        ("NousResearch/Meta-Llama-3-8B", "meta-llama/Meta-Llama-3-8B"),
        ("nousresearch/meta-llama-3-8b-instruct", "meta-llama/Meta-Llama-3-8B"),
        ("unsloth/llama-3-8b-bnb-4bit", "meta-llama/Meta-Llama-3-8B"),
        ("meta-llama/Meta-Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B"),  # the id before Meta's rename
        ("unsloth/Meta-Llama-3.1-8B-Instruct-bnb-4bit", "meta-llama/Llama-3.1-8B"),
        ("unsloth/Llama-3.2-1B-Instruct-unsloth-bnb-4bit", "meta-llama/Llama-3.2-1B"),
        ("unsloth/Llama-3.3-70B-Instruct", "meta-llama/Llama-3.3-70B-Instruct"),
        ("meta-llama/Llama-2-7b-chat-hf", "meta-llama/Llama-2-7b-hf"),
        ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B"),
        ("Qwen/Qwen3-8B-Base", "Qwen/Qwen3-8B"),
        ("mistralai/Mistral-7B-Instruct-v0.3", "mistralai/Mistral-7B-v0.3"),
        ("unsloth/mistral-7b-instruct-v0.3-bnb-4bit", "mistralai/Mistral-7B-v0.3"),
        ("mistral-community/Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x7B-v0.1"),
        ("unsloth/Phi-3-mini-4k-instruct", "microsoft/Phi-3-mini-4k-instruct"),
        ("unsloth/Phi-3-mini-128k-instruct", "microsoft/Phi-3-mini-128k-instruct"),  # -128k is kept
        ("unsloth/phi-4", "microsoft/phi-4"),
        ("google/gemma-2-9b-it", "google/gemma-2-9b"),
        ("unsloth/gemma-3-4b-it", "google/gemma-3-4b-pt"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M"),
    ],
)
def test_mirrors_and_variants_resolve_to_the_original(model_id, entry):
    file, source = resolve_config(make(model_id))
    assert file == catalog.entries()[entry]
    assert source == f"catalog {entry.replace('/', '--')}.json"


@pytest.mark.parametrize(
    "model_id",
    [
        "someone/Llama-3.1-8B",  # a name alone does not vouch for an unknown org's model
        "unsloth/Llama-3.1-8B-GPTQ",  # a different checkpoint format
        "Qwen/Qwen2.5-7B-Instruct-1M",  # a longer context
        "Llama-3.1-8B",  # not a hub id
    ],
)
def test_names_that_may_change_the_model_are_not_matched(model_id):
    assert catalog.lookup(model_id) is None


def test_unknown_model_lists_near_matches():
    with pytest.raises(RecipeError) as err:
        resolve_config(make("someone/Llama-3.1-8B"))
    (p,) = err.value.problems
    searched = Path(os.environ["HF_HOME"]) / "hub" / "models--someone--Llama-3.1-8B"
    assert (p.path, p.message) == ("model.path", "no config found for 'someone/Llama-3.1-8B': not a local folder, "
                                                 f"not in the HF cache (searched {searched}), not in the catalog")
    assert p.hint.startswith("did you mean meta-llama/Llama-3.1-8B, ")
    assert "set model.config to a local config.json" in p.hint
    assert "(NousResearch, unsloth, mistral-community)" in p.hint
    assert p.location.file is None  # unlocated: `ftune plan` locates it in the recipe (see test_estimate_cli)


TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
        "tie_word_embeddings": False}


def test_model_config_plans_a_model_the_catalog_lacks(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    for given in (tmp_path / "config.json", tmp_path):  # the file, or its folder
        file, source = resolve_config(make("acme/private-7b", config=str(given)))
        assert (file, source) == (tmp_path / "config.json", f"model.config {tmp_path / 'config.json'}")
    est = estimate(make("acme/private-7b", config=str(tmp_path)), world_size=1, num_processes=1,
                   gpu_memory=None, device="cpu", seq_length=16)
    assert est.params_total == closed_form(TINY) == 2 * 1000 * 64 + 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128
                                                                         + 2 * 64) + 64


def test_model_config_comes_after_the_models_own_and_before_the_catalog(tmp_path, tiny_model_dir):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    own = str(tmp_path / "config.json")
    assert resolve_config(make(str(tiny_model_dir), config=own))[1] == f"local {tiny_model_dir}"
    assert resolve_config(make("meta-llama/Llama-3.1-8B", config=own))[1] == f"model.config {own}"


def test_missing_model_config_is_located_in_the_recipe(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.yaml").write_text("name: t\nmodel:\n  path: acme/private-7b\n  config: nope/config.json\n"
                                     "data:\n  train: [{path: d.jsonl}]\ntrain:\n  max_steps: 2\n")
    assert main(["plan", "r.yaml"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{tmp_path / 'r.yaml'}:4:3: error: model.config: 'nope/config.json' does not exist")
    assert "relative to the working directory" in err


# Mixture-of-experts entries: published totals, and the active count per token from the config alone.
MOE_TOTALS = {
    "mistralai/Mixtral-8x7B-v0.1": 46_702_792_704,
    "Qwen/Qwen3-30B-A3B": 30_532_122_624,
    "Qwen/Qwen3-235B-A22B": 235_093_634_560,
    "openai/gpt-oss-20b": 20_914_757_184,
    "openai/gpt-oss-120b": 116_829_156_672,
    "allenai/OLMoE-1B-7B-0924": 6_919_161_856,
    "deepseek-ai/DeepSeek-V2-Lite": 15_706_484_224,
}


@pytest.mark.parametrize("model_id", sorted(MOE_TOTALS))
def test_moe_total_and_active_counts(model_id):
    """ftune.models.moe.count on the meta model agrees with the config's closed form: total, routed experts, and the
    active count (everything but the experts, plus top_k / num_experts of them)."""
    from ftune.models import moe

    cfg = config(model_id)
    model, _, _ = _build(make(model_id), catalog.lookup(model_id)[1])
    counts = moe.count(model)
    total, experts = _closed_form(cfg)
    top_k = cfg.get("num_experts_per_tok") or cfg["experts_per_token"]
    num = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg["n_routed_experts"]
    assert (counts.total, counts.experts, counts.num_experts, counts.top_k) == (MOE_TOTALS[model_id], experts, num,
                                                                                  top_k)
    assert counts.active == total - experts + experts * top_k // num


def test_moe_active_counts_as_published():
    """The active counts the model cards round: Mixtral 12.9B, Qwen3-30B-A3B 3.3B, Qwen3-235B-A22B 22B, OLMoE 1.3B
    (gpt-oss's 3.6B and 5.1B leave out the 0.58B embedding)."""
    from ftune.models import moe

    active = {m: moe.count(_build(make(m), catalog.lookup(m)[1])[0]).active for m in MOE_TOTALS}
    assert active["mistralai/Mixtral-8x7B-v0.1"] == 12_879_925_248
    assert active["Qwen/Qwen3-30B-A3B"] == 3_353_032_704
    assert active["Qwen/Qwen3-235B-A22B"] == 22_190_763_520
    assert active["allenai/OLMoE-1B-7B-0924"] == 1_282_017_280
    embedding = 201_088 * 2880
    assert round((active["openai/gpt-oss-20b"] - embedding) / 1e9, 1) == 3.6
    assert round((active["openai/gpt-oss-120b"] - embedding) / 1e9, 1) == 5.1
