"""`ftune import`: each peer's sample configs (written for these tests) become recipes that validate,
every mapped key is translated, every other key is listed with its line and reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ftune.cli.main import main
from ftune.importers import PEERS, convert
from ftune.recipe import load_recipe

DATA = Path(__file__).resolve().parents[1] / "data" / "import"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "import.md"
SAMPLES = [(peer, f) for peer in PEERS for f in sorted((DATA / peer).glob("*.y*ml"))]


def run_import(capsys, tmp_path, peer: str, file: Path, *extra: str) -> tuple[int, dict, str, str]:
    out = tmp_path / f"{peer}-{file.stem}.yaml"  # a new file each time: -o replaces nothing without --force
    code = main(["import", peer, str(file), "-o", str(out), *extra])
    captured = capsys.readouterr()
    text = out.read_text() if out.exists() else ""
    return code, yaml.safe_load(text) if text else {}, text, captured.err


@pytest.mark.parametrize(("peer", "file"), SAMPLES, ids=[f"{p}/{f.name}" for p, f in SAMPLES])
def test_every_sample_imports_to_a_valid_recipe(peer, file, tmp_path, capsys):
    code, _, text, err = run_import(capsys, tmp_path, peer, file)
    imported = convert(peer, str(file))
    changes = sum(u.changes for u in imported.unmapped)
    assert code == (1 if changes else 0), err  # a key left out that changes what is trained: exit 1
    if changes:
        assert err.splitlines()[-1].startswith(f"exit 1: the recipe trains differently from the {peer} config in "
                                               f"{changes} way")
        (tmp_path / f"{peer}-{file.stem}.yaml").unlink()
        code, _, text, err = run_import(capsys, tmp_path, peer, file, "--accept-changes")
        assert code == 0, err
    loaded = load_recipe(tmp_path / f"{peer}-{file.stem}.yaml")  # ftune's own loader: schema and rules
    assert loaded.recipe.model.path
    # every unmapped key: on stderr with file:line, and as a comment at the top of the recipe
    for u in imported.unmapped:
        assert u.line is not None, u
        what = "CHANGES BEHAVIOUR, not imported" if u.changes else "not imported"
        assert f"{file.name}:{u.line}: {what}: {u.key}: {u.reason}" in err.replace(str(file), file.name)
        assert f"#   line {u.line}: {u.key}: {u.reason}" in text
    assert len(SAMPLES) >= 6


def test_axolotl_qlora_values(tmp_path, capsys):
    code, r, text, err = run_import(capsys, tmp_path, "axolotl", DATA / "axolotl" / "qlora.yml", "--accept-changes")
    assert code == 0
    assert r["model"] == {"path": "models/tiny-llama", "trust_remote_code": False, "dtype": "bfloat16",
                          "attn_implementation": "flash_attention_2",
                          "special_tokens": {"pad_token": "<|pad|>", "eos_token": "<|im_end|>"}}
    assert r["peft"] == {"method": "lora", "r": 32, "alpha": 64.0, "dropout": 0.1, "target_modules": "all-linear",
                         "modules_to_save": ["embed_tokens", "lm_head"]}
    assert r["quantization"] == {"bits": 4, "type": "nf4", "double_quant": True, "compute_dtype": "bfloat16"}
    chat, hub = r["data"]["train"]
    assert chat == {"path": "data/support_chats.jsonl", "type": "json", "format": "chat",
                    "fields": {"messages": "dialogue", "role": "speaker", "content": "text"},
                    "roles": {"customer": "user", "agent": "assistant"}}
    assert hub == {"path": "acme/instructions-v2", "type": "hub", "format": "instruction", "split": "train"}
    d = r["data"]
    assert (d["eval"], d["max_seq_length"], d["packing"], d["train_on"]) == ({"split": 0.05}, 2048, True, "completion")
    t = r["train"]
    assert (t["per_device_batch_size"], t["gradient_accumulation_steps"], t["epochs"]) == (2, 8, 3)
    assert (t["learning_rate"], t["lr_scheduler"], t["warmup_ratio"]) == (2e-4, "cosine_with_min_lr", 0.03)  # "2e-4": a str
    assert t["lr_scheduler_args"] == {"min_lr_rate": 0.1}  # cosine_min_lr_ratio
    assert (t["optimizer"], t["mixed_precision"], t["gradient_checkpointing"]) == ("paged_adamw_8bit", "bf16", True)
    assert r["eval"] == {"strategy": "steps", "steps": 50}
    assert r["checkpoint"] == {"strategy": "steps", "steps": 100, "keep": 2}
    assert r["output"] == {"dir": "./outputs/support-qlora", "report_to": ["wandb"],
                           "trackers": {"wandb": {"project": "support-bot", "entity": "acme"}}}
    assert r["name"] == "support-qlora"
    unmapped = {u.key: u for u in convert("axolotl", str(DATA / "axolotl" / "qlora.yml")).unmapped}
    assert not any(key.startswith("special_tokens") for key in unmapped)
    assert "wandb_project" not in unmapped and "wandb_entity" not in unmapped
    assert unmapped["datasets.1.shards"].line == 30
    assert "chat_template" not in unmapped and r["data"]["chat_template"] == "chatml" and "tf32" in unmapped
    assert "wandb_watch" not in unmapped  # an empty key asks for nothing


def test_axolotl_fsdp_and_deepspeed(tmp_path, capsys):
    _, r, _, _ = run_import(capsys, tmp_path, "axolotl", DATA / "axolotl" / "full-fsdp.yml")
    assert r["peft"] == {"method": "full"}
    assert r["distributed"] == {"strategy": "fsdp", "num_processes": "auto", "fsdp": {
        "version": 2, "auto_wrap_policy": "transformer", "transformer_layer_cls": ["LlamaDecoderLayer"],
        "cpu_offload": False, "state_dict_type": "full", "reshard_after_forward": True,
        "activation_checkpointing": True}}
    qa = r["data"]["train"][1]
    assert qa["fields"] == {"instruction": "question", "output": "answer"} and qa["template"] == "Q: {instruction}\nA: "
    assert r["data"]["eval"] == [{"path": "corpus/heldout.jsonl", "format": "instruction"}]
    assert r["train"]["early_stopping"] == {"patience": 3} and r["eval"]["strategy"] == "epoch"
    assert "per_epoch" not in r["eval"] and r["checkpoint"]["strategy"] == "epoch"  # max_steps: once per epoch
    _, r, _, _ = run_import(capsys, tmp_path, "axolotl", DATA / "axolotl" / "lora-deepspeed.yml")
    assert r["distributed"] == {"strategy": "deepspeed", "num_processes": "auto", "deepspeed": {"stage": 2}}
    assert r["quantization"] == {"bits": 8} and r["model"]["dtype"] == "float16"
    assert r["peft"]["target_modules"] == ["q_proj", "v_proj", "k_proj", "o_proj"] and r["peft"]["use_rslora"] is True


def test_llama_factory_resolves_dataset_info(tmp_path, capsys):
    code, r, text, _ = run_import(capsys, tmp_path, "llama-factory", DATA / "llama-factory" / "qlora-sft.yaml")
    assert code == 0
    chat, faq, hub = r["data"]["train"]
    assert chat == {"path": "data/support_chats.json", "format": "chat", "fields": {"messages": "turns"},
                    "roles": {"customer": "user", "agent": "assistant"}, "limit": 5000}
    assert faq["fields"] == {"instruction": "question", "input": "context", "output": "answer"}
    assert hub == {"path": "acme/instructions-v2", "type": "hub", "format": "instruction", "split": "train",
                   "as_chat": True, "limit": 5000}  # `template: llama3` renders alpaca rows as chat turns
    assert r["data"]["chat_template"] == "llama3" and faq["as_chat"] is True
    assert r["peft"] == {"method": "lora", "r": 16, "alpha": 32.0, "dropout": 0.05,
                         "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "use_rslora": True}
    assert r["quantization"] == {"bits": 4, "type": "nf4", "double_quant": True, "compute_dtype": "bfloat16"}
    assert r["name"] == "support-qlora"  # run_name
    assert r["eval"] == {"strategy": "steps", "steps": 200, "batch_size": 2}
    assert r["train"]["gradient_checkpointing"] is True  # LLaMA-Factory's default
    # defaults that differ from ftune's are written out
    _, r, _, _ = run_import(capsys, tmp_path, "llama-factory", DATA / "llama-factory" / "lora-fsdp.yaml")
    assert r["peft"] == {"method": "lora", "r": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": "all-linear"}
    assert r["train"]["epochs"] == 3.0 and r["train"]["gradient_checkpointing"] is False
    assert r["distributed"]["fsdp"] == {"sharding_strategy": "full_shard", "transformer_layer_cls": ["LlamaDecoderLayer"],
                                        "cpu_offload": True, "state_dict_type": "sharded"}


def test_llama_factory_deepspeed_and_unknown_dataset(tmp_path, capsys):
    _, r, text, _ = run_import(capsys, tmp_path, "llama-factory", DATA / "llama-factory" / "full-ds3.yaml")
    assert r["distributed"]["deepspeed"] == {"stage": 3, "offload_optimizer": True, "offload_params": True}
    # LLaMA-Factory's qwen template adds another default system line than ftune's qwen: not imported, listed
    assert r["data"]["train"] == [{"path": "org_chat_mix", "type": "hub", "format": "instruction"}]
    assert "chat_template" not in r["data"] and "# CHANGES BEHAVIOUR" in text
    assert "template: template 'qwen' has no ftune built-in that renders the same text" in text
    assert "'org_chat_mix' is not described in data/dataset_info.json" in text
    assert r["train"]["lr_scheduler"] == "cosine_with_min_lr" and r["checkpoint"] == {"strategy": "epoch"}
    assert r["train"]["lr_scheduler_args"] == {"min_lr_rate": 0.1}  # the scheduler needs it (a validate rule)


def test_torchtune_components(tmp_path, capsys):
    _, r, text, _ = run_import(capsys, tmp_path, "torchtune", DATA / "torchtune" / "qlora-single.yaml")
    assert r["model"] == {"path": "models/llama-1b", "dtype": "bfloat16"}
    assert r["peft"]["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert r["quantization"]["bits"] == 4
    assert r["data"]["train"] == [{"path": "data/support_chats.jsonl", "type": "json", "format": "chat",
                                   "split": "train", "fields": {"messages": "dialogue"}}]
    assert (r["data"]["packing"], r["data"]["max_seq_length"]) == (True, 2048)
    t = r["train"]
    assert (t["optimizer"], t["learning_rate"], t["lr_scheduler"], t["warmup_steps"]) == ("paged_adamw_8bit", 2e-4,
                                                                                          "cosine", 50)
    assert r["output"]["report_to"] == ["wandb"]
    assert t["tiled_loss"] is True  # CEWithChunkedOutputLoss: the same loss over the logits in chunks
    assert "line 65: metric_logger.project: ftune has no key for it; export WANDB_PROJECT=tt-qlora" in text
    _, r, text, _ = run_import(capsys, tmp_path, "torchtune", DATA / "torchtune" / "full-fsdp.yaml")
    assert r["peft"] == {"method": "full"} and r["train"]["lr_scheduler"] == "constant"
    assert r["train"]["optimizer"] == "adamw_torch_fused"
    assert r["distributed"] == {"strategy": "fsdp", "num_processes": "auto",
                                "fsdp": {"cpu_offload": True, "reshard_after_forward": True}}
    assert [s["path"] for s in r["data"]["train"]] == ["yahma/alpaca-cleaned", "corpus/notes.txt"]
    assert r["data"]["eval"][0]["fields"] == {"instruction": "prompt", "output": "response"}
    assert r["eval"] == {"strategy": "steps", "steps": 100, "batch_size": 4}


def test_stdout_and_exit_codes(tmp_path, capsys):
    code = main(["import", "torchtune", str(DATA / "torchtune" / "qlora-single.yaml")])
    out = capsys.readouterr()
    assert code == 0 and out.out.startswith("# Imported from the torchtune config")
    assert "10 keys not imported" in out.err
    assert yaml.safe_load(out.out)["name"] == "qlora-single"
    bad = tmp_path / "bad.yml"
    bad.write_text("base_model: m\ndatasets:\n  - path: x\n   type: alpaca\n")
    assert main(["import", "axolotl", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:4:" in err and "YAML syntax error" in err
    assert main(["import", "axolotl", str(tmp_path / "missing.yml")]) == 1
    assert "axolotl config not found" in capsys.readouterr().err
    (tmp_path / "list.yml").write_text("- a\n- b\n")
    assert main(["import", "torchtune", str(tmp_path / "list.yml")]) == 1
    assert "expected a mapping" in capsys.readouterr().err


def test_output_that_does_not_validate_is_written_and_reported(tmp_path, capsys):
    cfg = tmp_path / "odd.yml"
    cfg.write_text("base_model: m\ndatasets:\n  - path: x.jsonl\n    type: oasst\nnum_epochs: 1\n")
    out = tmp_path / "r.yaml"
    assert main(["import", "axolotl", str(cfg), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "odd.yml:4: not imported: datasets.0.type: dataset type 'oasst' has no ftune data format" in err
    assert "does not validate" in err and "data" in err
    assert out.read_text().startswith("# Imported from the axolotl config")


def test_mapping_tables_are_documented():
    from ftune.importers import axolotl, llama_factory, torchtune

    docs = DOCS.read_text()
    for module in (axolotl, llama_factory, torchtune):
        missing = [key for key in module.TABLE if not key.startswith("fsdp_config.") and f"`{key}`" not in docs]
        assert not missing, f"{module.PEER} keys missing from docs/import.md: {missing}"


def test_new_recipe_keys_are_imported(tmp_path, capsys):
    """Keys that have ftune equivalents since issue 12: tokens, timeouts, per-epoch schedules, template names."""
    _, r, _, _ = run_import(capsys, tmp_path, "llama-factory", DATA / "llama-factory" / "qlora-sft.yaml")
    assert r["model"]["add_tokens"] == ["<|tool|>", "<|end_tool|>"] and r["distributed"]["timeout"] == 180000000
    cfg = tmp_path / "epochs.yml"
    cfg.write_text("base_model: m\ndatasets:\n  - path: d.jsonl\n    type: completion\nnum_epochs: 2\n"
                   "evals_per_epoch: 4\nsaves_per_epoch: 2\nval_set_size: 0.1\nchat_template: qwen_25\n"
                   "tokens: ['<x>']\nddp_timeout: 7200\n")
    _, r, _, _ = run_import(capsys, tmp_path, "axolotl", cfg)
    assert (r["eval"], r["checkpoint"]["per_epoch"]) == ({"per_epoch": 4}, 2)
    assert (r["data"]["chat_template"], r["model"]["add_tokens"], r["distributed"]["timeout"]) == ("qwen", ["<x>"], 7200)
