"""The plan's sequence length (issue #45): data.max_seq_length unset plans the data's longest tokenized row (or is
refused, located, when the data can't be read), and a length past the model's positions, stretched by any rope
scaling, is refused at plan time whatever the config's source (a local folder, the cache, the catalog)."""

from __future__ import annotations

import json

import pytest
import yaml

from ftune.cli.main import main
from ftune.models.config import positions
from ftune.plan.checks.preflight import length_problems
from ftune.recipe.schema import Recipe

LLAMA31 = {"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                                                "original_max_position_embeddings": 8192}}
QWEN_YARN = {"max_position_embeddings": 32768, "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                                "original_max_position_embeddings": 32768}}


@pytest.mark.parametrize(("config", "want"), [
    ({"max_position_embeddings": 4096}, (4096, "max_position_embeddings")),
    (LLAMA31, (131072, "max_position_embeddings")),  # llama3 scaling writes the stretched length itself
    (QWEN_YARN, (131072, "32768 positions x yarn rope scaling factor 4")),  # Qwen's YaRN recipe: 4 x 32k
    ({"max_position_embeddings": 2048, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
     (4096, "2048 positions x linear rope scaling factor 2")),
    ({"text_config": {"max_position_embeddings": 8192}}, (8192, "max_position_embeddings")),  # a VLM's text model
    ({"hidden_size": 64}, None),
])
def test_positions_include_rope_scaling(config, want):
    assert positions(config) == want


def recipe(length: int | None) -> Recipe:
    return Recipe.model_validate({"name": "t", "model": {"path": "org/m"}, "data": {"train": [{"path": "d.jsonl"}],
                                  "max_seq_length": length}})


def test_a_length_past_the_stretched_positions_is_a_problem():
    assert length_problems(recipe(131072), QWEN_YARN) == []
    [p] = length_problems(recipe(500_000), QWEN_YARN)
    assert (p.path, p.message, p.hint) == (
        "data.max_seq_length", "500000 is longer than the model's 131072 positions (32768 positions x yarn rope "
        "scaling factor 4, in org/m/config.json)", "set data.max_seq_length to at most 131072 (longer rows are "
        "truncated)")
    [p] = length_problems(recipe(None), {"max_position_embeddings": 512}, longest=600)
    assert p.message == ("unset, and the data's longest row (600 tokens) is longer than the model's "
                         "max_position_embeddings (512, in org/m/config.json)")
    assert length_problems(recipe(None), {"max_position_embeddings": 512}, longest=500) == []


def test_plan_refuses_a_length_past_a_catalog_models_positions(tmp_path, capsys, monkeypatch):
    """Llama 3.1 from the bundled catalog (no local config, so the compiler's preflight doesn't run): 500k tokens
    on its 131k positions is refused by `ftune plan`, located."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.jsonl").write_text(json.dumps({"text": "a b c"}) + "\n")
    spec = {"name": "long", "model": {"path": "meta-llama/Llama-3.1-8B"}, "peft": {"method": "lora"},
            "data": {"train": [{"path": "d.jsonl"}], "max_seq_length": 500_000}, "train": {"max_steps": 1}}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert main(["plan", "r.yaml", "--gpu-memory", "80GB"]) == 1
    err = capsys.readouterr().err
    assert "error: data.max_seq_length: 500000 is longer than the model's max_position_embeddings (131072, in " \
           "meta-llama/Llama-3.1-8B/config.json)" in err


def test_plan_sizes_an_unset_length_by_the_longest_row(tmp_path, capsys, tiny_model_dir):
    rows = ["a b", "a b c d e f g h i j k l m n o p", "c d e"]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in rows))
    spec = {"name": "short", "model": {"path": str(tiny_model_dir)}, "peft": {"method": "lora"},
            "data": {"train": [{"path": str(tmp_path / "d.jsonl")}]}, "train": {"max_steps": 1},
            "output": {"dir": str(tmp_path / "runs")}}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert main(["plan", str(tmp_path / "r.yaml"), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    longest = max(len(tok.encode(t).ids) for t in rows)
    assert out["data"]["longest"] == longest
    assert f"data.max_seq_length unset: activations for the longest tokenized row, {longest} tokens" in out["notes"]
