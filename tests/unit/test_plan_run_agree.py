"""`ftune plan` and `ftune run --dry-run` compile the same Plan (#44): one config resolver and one meta-model builder
(`ftune.models.meta`) serve the compiler's preflight whether or not the inputs are checked, so the decisions it takes
from the model's structure (FSDP's wrap classes in the accelerate config, DDP's unused-parameter search in the
TrainingArguments) are the same for a local folder, a hub id in the HF cache (online, where plan used to skip the
inspection) and a model planned from `model.config` alone (as from the catalog)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from ftune import hub
from ftune.cli.plan import _compile as plan_compile
from ftune.plan.compile import compile_plan
from ftune.recipe import load_recipe


def _recipe(tmp_path: Path, model: str, strategy: str, name: str, **model_keys) -> Path:
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "hello there"}\n')
    recipe = {"name": name, "model": {"path": model, **model_keys}, "data": {"train": [{"path": str(data)}]},
              "peft": {"method": "lora", "experts": True, "dropout": 0.0},
              "distributed": {"strategy": strategy, "num_processes": 2},
              "train": {"max_steps": 2}, "output": {"dir": str(tmp_path / "runs" / name)}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def _cache(repo_id: str, folder: Path) -> None:
    """The folder as the hub client caches it: snapshots/<commit>/ and refs/main."""
    commit = "c" * 40
    repo = hub.repo_folder(repo_id)
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(folder, repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)


def _structural(plan) -> tuple:
    """What the plan decides from the model's structure."""
    return plan.launch.accelerate_config.get("fsdp_config", {}).get("fsdp_transformer_layer_cls_to_wrap"), \
        plan.trainer.get("ddp_find_unused_parameters")


def _both(path: Path):
    loaded = load_recipe(path)
    return plan_compile(loaded, None).plan, compile_plan(loaded)  # `ftune plan`'s compile and `run --dry-run`'s


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_plan_and_run_compile_the_same_plan_for_a_folder_and_a_cached_id(tmp_path, monkeypatch, strategy,
                                                                          tiny_qwen3_moe_dir):
    repo_id = f"acme/agree-{strategy}"
    _cache(repo_id, tiny_qwen3_moe_dir)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # online: the id is not a folder, and no hub answers (the cache does)
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "0")
    for model in (str(tiny_qwen3_moe_dir), repo_id):
        plan, run = _both(_recipe(tmp_path, model, strategy, "agree"))
        assert plan.model_dump(mode="json") == run.model_dump(mode="json")
        assert _structural(plan) == ((None, False) if strategy == "ddp" else ("Qwen3MoeDecoderLayer", None))


def test_a_model_planned_from_its_config_alone_decides_as_its_folder(tmp_path, tiny_qwen3_moe_dir):
    """`model.config` (a hub id not on this machine, as a catalog entry plans it): the wrap classes and the DDP
    search are decided from that config, as `run` decides them on the model's folder."""
    for strategy in ("ddp", "fsdp"):
        folder, _ = _both(_recipe(tmp_path, str(tiny_qwen3_moe_dir), strategy, "folder"))
        planned = plan_compile(load_recipe(_recipe(tmp_path, "acme/not-here", strategy, "config",
                                                   config=str(tiny_qwen3_moe_dir / "config.json"))), None).plan
        assert _structural(planned) == _structural(folder) != (None, None)
        assert planned.launch.accelerate_config == folder.launch.accelerate_config
