"""`ftune import` never changes training silently (issue 21): every peer setting that changes what is trained is
mapped, refused (exit 1, located), or listed under "CHANGES BEHAVIOUR"; the peers' defaults are written out where
they differ from ftune's; docs/import.md's tables are generated from the peers' TABLEs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ftune.cli.main import main
from ftune.importers import convert
from ftune.importers._core import Key, Skip

DATA = Path(__file__).resolve().parents[1] / "data" / "import"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "import.md"


def imported(tmp_path, peer: str, text: str, name: str = "c.yaml") -> dict:
    cfg = tmp_path / name
    cfg.write_text(text)
    return convert(peer, str(cfg))


def recipe(tmp_path, peer: str, text: str) -> dict:
    return imported(tmp_path, peer, text).recipe


def get(r: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(r, dict) or part not in r:
            return None
        r = r[part]
    return r


AX = "base_model: m\ndatasets:\n  - path: d.jsonl\n    type: alpaca\nnum_epochs: 1\n"
LF = "model_name_or_path: m\nstage: sft\ndataset: d\ntemplate: llama3\nnum_train_epochs: 1\n"
TT = ("model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\nepochs: 1\ncheckpointer:\n  checkpoint_dir: m\n"
      "dataset:\n  _component_: torchtune.datasets.alpaca_dataset\n")

# (peer, base config, extra peer lines, ftune key, expected value). Each row: the peer's value maps to this ftune value.
MAPPED = [
    ("llama-factory", LF, "streaming: true\nmax_steps: 10\n", "data.streaming", True),
    ("llama-factory", LF, "mix_strategy: interleave_over\n", "data.mix", "interleave"),
    ("llama-factory", LF, "mix_strategy: interleave_over\n", "data.mix_stopping", "all_exhausted"),
    ("llama-factory", LF, "mix_strategy: interleave_under\n", "data.mix_stopping", "first_exhausted"),
    ("llama-factory", LF, "adapter_name_or_path: saves/sft\n", "model.path", "saves/sft"),
    ("axolotl", AX, "lora_model_dir: out/adapter\n", "model.path", "out/adapter"),
    ("axolotl", AX, "attn_implementation: flex_attention\n", "model.attn_implementation", "flex_attention"),
    ("axolotl", AX, "attn_implementation: sdpa\n", "model.attn_implementation", "sdpa"),
    ("axolotl", AX, "rl: dpo\nrl_beta: 0.2\n", "train.objective", "dpo"),
    ("axolotl", AX, "rl: dpo\nrl_beta: 0.2\n", "train.preference.beta", 0.2),
    ("axolotl", AX, "rl: ipo\n", "train.preference.loss_type", "ipo"),
    ("axolotl", AX, "rl: orpo\norpo_alpha: 0.1\n", "train.objective", "orpo"),
    ("axolotl", AX, "rl: kto\n", "train.objective", "kto"),
    ("axolotl", AX, "rl: simpo\nsimpo_gamma: 0.7\n", "train.preference.gamma", 0.7),
    ("axolotl", AX, "plugins: [axolotl.integrations.liger.LigerPlugin]\nliger_rms_norm: true\n", "train.kernels",
     "liger"),
    ("axolotl", AX, "torch_compile: true\n", "train.compile", True),
    ("axolotl", AX, "torch_compile: auto\n", "train.compile", True),
    ("axolotl", AX, "activation_offloading: legacy\n", "train.activation_offloading", True),
    ("axolotl", AX, "tiled_mlp: true\ntiled_mlp_num_shards: 8\n", "train.tiled_mlp_shards", 8),
    ("axolotl", AX, "dataloader_num_workers: 3\n", "train.dataloader.workers", 3),
    ("axolotl", AX, "adam_beta2: 0.95\n", "train.optimizer_args.betas", [0.9, 0.95]),
    ("axolotl", AX, "adam_beta1: 0.8\nadam_beta2: 0.95\n", "train.optimizer_args.betas", [0.8, 0.95]),
    ("axolotl", AX, "adam_epsilon: 1e-6\n", "train.optimizer_args.eps", 1e-6),
    ("axolotl", AX, "max_grad_norm: 0.5\n", "train.max_grad_norm", 0.5),
    ("axolotl", AX, "chat_template: llama3\n", "data.chat_template", "llama3"),
    ("axolotl", AX, "group_by_length: true\n", "train.group_by_length", True),
    ("llama-factory", LF.replace("stage: sft", "stage: dpo"), "pref_beta: 0.2\n", "train.objective", "dpo"),
    ("llama-factory", LF.replace("stage: sft", "stage: dpo"), "pref_beta: 0.2\n", "train.preference.beta", 0.2),
    ("llama-factory", LF.replace("stage: sft", "stage: dpo"), "pref_loss: orpo\n", "train.objective", "orpo"),
    ("llama-factory", LF.replace("stage: sft", "stage: dpo"), "pref_loss: simpo\nsimpo_gamma: 0.6\n",
     "train.objective", "simpo"),
    ("llama-factory", LF.replace("stage: sft", "stage: dpo"), "pref_loss: hinge\n", "train.preference.loss_type",
     "hinge"),
    ("llama-factory", LF.replace("stage: sft", "stage: kto"), "kto_chosen_weight: 1.5\n",
     "train.preference.desirable_weight", 1.5),
    ("llama-factory", LF.replace("stage: sft", "stage: kto"), "", "train.objective", "kto"),
    ("llama-factory", LF, "", "data.chat_template", "llama3"),
    ("llama-factory", LF.replace("llama3", "qwen3"), "", "data.chat_template", "qwen3"),
    ("llama-factory", LF.replace("llama3", "qwen3_nothink"), "", "data.chat_template", "chatml"),
    ("llama-factory", LF.replace("llama3", "phi"), "", "data.chat_template", "phi3"),
    ("llama-factory", LF, "enable_liger_kernel: true\n", "train.kernels", "liger"),
    ("llama-factory", LF, "dataloader_num_workers: 4\n", "train.dataloader.workers", 4),
    ("llama-factory", LF, "flash_attn: sdpa\n", "model.attn_implementation", "sdpa"),
    ("llama-factory", LF, "adam_beta2: 0.95\nadam_epsilon: 1.0e-6\n", "train.optimizer_args",
     {"betas": [0.9, 0.95], "eps": 1e-6}),
    ("llama-factory", LF, "torch_compile: true\n", "train.compile", True),
    ("llama-factory", LF, "max_grad_norm: 0.3\n", "train.max_grad_norm", 0.3),
    ("torchtune", TT, "clip_grad_norm: 0.5\n", "train.max_grad_norm", 0.5),
    ("torchtune", TT, "clip_grad_norm: null\n", "train.max_grad_norm", 0.0),
    ("torchtune", TT, "compile: true\n", "train.compile", True),
    ("torchtune", TT, "loss:\n  _component_: torchtune.modules.loss.CEWithChunkedOutputLoss\n", "train.tiled_loss",
     True),
    ("torchtune", TT, "loss:\n  _component_: torchtune.modules.loss.LinearCrossEntropyLoss\n  num_output_chunks: 16\n",
     "train.tiled_loss_shards", 16),
    ("torchtune", TT, "enable_activation_offloading: true\n", "train.activation_offloading", True),
    ("torchtune", TT, "optimizer:\n  _component_: torch.optim.AdamW\n  lr: 1e-4\n  betas: [0.9, 0.95]\n  eps: 1e-6\n",
     "train.optimizer_args", {"betas": [0.9, 0.95], "eps": 1e-6}),
    ("torchtune", TT.replace("alpaca_dataset\n", "alpaca_dataset\n  train_on_input: false\n"), "", "data.train_on",
     None),  # completion: ftune's default, not written
]


@pytest.mark.parametrize(("peer", "base", "extra", "key", "want"), MAPPED,
                         ids=[f"{p}:{e.strip().splitlines()[0] if e.strip() else k}" for p, _, e, k, _ in MAPPED])
def test_peer_value_maps_to_the_ftune_value(tmp_path, peer, base, extra, key, want):
    result = imported(tmp_path, peer, base + extra)
    assert get(result.recipe, key) == want
    assert not [u for u in result.unmapped if u.changes], result.unmapped


# Per peer: its defaults for loss masking, clipping and template, with the key absent from the config.
DEFAULTS = [
    ("axolotl", AX, {"data.train_on": None, "train.max_grad_norm": None, "data.chat_template": None}),
    ("llama-factory", LF.replace("template: llama3\n", ""),
     {"data.train_on": None, "train.max_grad_norm": None, "data.chat_template": None}),
    ("torchtune", TT, {"data.train_on": "all", "train.max_grad_norm": 0.0, "data.chat_template": None}),
]
# ftune's defaults the None above stand for; each equals the peer's (axolotl: train_on_inputs false, max_grad_norm
# 1.0 as transformers; LLaMA-Factory: train_on_prompt false, transformers' 1.0; chat template: the tokenizer's).
FTUNE = {"data.train_on": "completion", "train.max_grad_norm": 1.0, "data.chat_template": None}


@pytest.mark.parametrize(("peer", "config", "want"), DEFAULTS, ids=[d[0] for d in DEFAULTS])
def test_peer_defaults_for_masking_clipping_and_template(tmp_path, peer, config, want):
    from ftune.recipe import load_recipe

    r = recipe(tmp_path, peer, config)
    for key, value in want.items():
        assert get(r, key) == value, key
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(r, sort_keys=False))
    loaded = load_recipe(tmp_path / "r.yaml").recipe
    for key, value in want.items():
        section, name = key.split(".")
        assert getattr(getattr(loaded, section), name) == (FTUNE[key] if value is None else value), key


def test_each_peers_preference_example_sets_the_objective(tmp_path, capsys):
    for peer, file in (("llama-factory", "dpo.yaml"), ("axolotl", "dpo.yml")):
        out = tmp_path / f"{peer}.yaml"
        code = main(["import", peer, str(DATA / peer / file), "-o", str(out), "--accept-changes"])
        assert code == 0, capsys.readouterr().err
        r = yaml.safe_load(out.read_text())
        assert r["train"]["objective"] == "dpo" and r["train"]["preference"]["beta"] == 0.1
        assert r["data"]["train"][0]["format"] == "preference"
    assert r["model"]["attn_implementation"] == "sdpa"  # the axolotl attn_implementation survives
    assert r["train"]["kernels"] == "liger" and r["train"]["optimizer_args"] == {"betas": [0.9, 0.95], "eps": 1e-5}


@pytest.mark.parametrize(("peer", "text", "line", "what"), [
    ("llama-factory", "model_name_or_path: m\ndataset: d\nstage: ppo\n", 3, "stage 'ppo' has no ftune objective"),
    ("llama-factory", "model_name_or_path: m\ndataset: d\nstage: rm\n", 3, "stage 'rm' has no ftune objective"),
    ("axolotl", AX + "rl: grpo\n", 6, "rl 'grpo' has no ftune objective"),
])
def test_objectives_ftune_lacks_exit_1_located(tmp_path, capsys, peer, text, line, what):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    assert main(["import", peer, str(cfg), "-o", str(tmp_path / "r.yaml")]) == 1
    err = capsys.readouterr().err
    assert f"c.yaml:{line}" in err and what in err and "Traceback" not in err
    assert not (tmp_path / "r.yaml").exists()


@pytest.mark.parametrize(("peer", "text", "key"), [
    ("llama-factory", LF.replace("stage: sft", "stage: dpo") + "pref_ftx: 1.0\n", "pref_ftx"),
    ("llama-factory", LF.replace("llama3", "deepseek3"), "template"),
    ("llama-factory", LF.replace("stage: sft", "stage: dpo") + "ref_model: other\n", "ref_model"),
    ("axolotl", AX + "chat_template: vicuna_v1\n", "chat_template"),
])
def test_what_changes_training_is_listed_loudly(tmp_path, capsys, peer, text, key):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    main(["import", peer, str(cfg), "-o", str(tmp_path / "r.yaml")])
    err = capsys.readouterr().err
    assert f"CHANGES BEHAVIOUR, not imported: {key}:" in err
    head = (tmp_path / "r.yaml").read_text().split("# Not imported")[0]
    assert "# CHANGES BEHAVIOUR" in head and f": {key}: " in head


def test_llama_factory_template_renders_alpaca_rows_as_chat(tmp_path):
    r = recipe(tmp_path, "llama-factory", LF)
    assert r["data"]["chat_template"] == "llama3" and r["data"]["train"][0]["as_chat"] is True
    pt = recipe(tmp_path, "llama-factory", LF.replace("stage: sft", "stage: pt"))
    assert "chat_template" not in pt["data"] and "as_chat" not in pt["data"]["train"][0]  # plain text: no template


def test_axolotl_eval_sample_packing_reason_is_true():
    from ftune.importers import axolotl

    assert isinstance(axolotl.TABLE["eval_sample_packing"], Key)  # ftune packs eval rows: nothing to set when true


def test_import_docs_are_generated_from_the_tables():
    from ftune.importers import axolotl, llama_factory, torchtune
    from ftune.importers.docs import KEY_DOCS, render

    text = DOCS.read_text()
    assert text == render(text), "docs/import.md is stale: run `make schemas` (python -m ftune.importers.docs ...)"
    for module in (axolotl, llama_factory, torchtune):
        for key in KEY_DOCS[module.PEER]:  # words only for translated keys: a skip's row is its reason
            assert isinstance(module.TABLE.get(key), Key), (module.PEER, key)
        skips = [(k, e) for k, e in module.TABLE.items() if isinstance(e, Skip) and not k.startswith("fsdp_config.")]
        for key, entry in skips:
            assert f"| `{key}` | — " in text and entry.reason.replace("|", "\\|") in text, key


def test_interleave_probs_become_the_sources_weights(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"instruction": "x", "output": "y"}\n')
    (tmp_path / "b.jsonl").write_text('{"instruction": "x", "output": "y"}\n')
    info = '{"a": {"file_name": "a.jsonl"}, "b": {"file_name": "b.jsonl"}}'
    (tmp_path / "dataset_info.json").write_text(info)
    text = (f"model_name_or_path: m\nstage: sft\ndataset: a,b\ndataset_dir: {tmp_path}\ntemplate: llama3\n"
            "num_train_epochs: 1\nmix_strategy: interleave_under\ninterleave_probs: 0.7,0.3\n")
    out = imported(tmp_path, "llama-factory", text)
    assert [s.get("weight") for s in out.recipe["data"]["train"]] == [0.7, 0.3]
    assert "interleave_probs" not in {u.key for u in out.unmapped}


def test_several_adapters_are_not_continued_as_one(tmp_path):
    out = imported(tmp_path, "llama-factory", LF + "adapter_name_or_path: a,b\n")
    assert out.recipe["model"]["path"] == "m"
    assert [u.changes for u in out.unmapped if u.key == "adapter_name_or_path"] == [True]
