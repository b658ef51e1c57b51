"""`model.path` at a saved adapter (a run's final/): the compiler continues it over its base, takes the recipe's
unset peft keys from it, and refuses a recipe that disagrees with it, located at the key to change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ftune.errors import RecipeError
from ftune.plan.compile import compile_plan
from ftune.recipe import load_recipe
from ftune.tiny import CONFIG

LORA = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8, "lora_dropout": 0.0,
        "target_modules": ["v_proj", "q_proj"], "modules_to_save": None, "bias": "none", "use_rslora": False,
        "use_dora": False}


def _adapter(tmp_path: Path, config: dict | None = None, record: dict | None = None, base: str | None = None,
             tokenizer: bool = True) -> Path:
    """A run's final/-like adapter folder (json only: the compiler reads no weights) over a model folder."""
    model = tmp_path / "base"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(CONFIG))  # a tiny Llama, no weights
    folder = tmp_path / "first" / "final"
    folder.mkdir(parents=True, exist_ok=True)
    cfg = dict(LORA if config is None else config)
    cfg.setdefault("base_model_name_or_path", str(model) if base is None else base)
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    if record is not None:
        (folder / "ftune.json").write_text(json.dumps(record))
    if tokenizer:
        (folder / "tokenizer.json").write_text("{}")
    return folder


def _compile(tmp_path: Path, model_path: Path | str, peft: dict | None = None, **top):
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "hello"}\n')
    recipe = {"name": "second", "model": {"path": str(model_path)}, "data": {"train": [{"path": str(data)}]},
              "train": {"max_steps": 2}, "output": {"dir": str(tmp_path / "runs" / "second")}}
    if peft is not None:
        recipe["peft"] = peft
    recipe.update(top)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return compile_plan(load_recipe(str(path)))


def _problem_list(tmp_path: Path, model_path, peft=None, **top) -> list:
    with pytest.raises(RecipeError) as info:
        _compile(tmp_path, model_path, peft, **top)
    return info.value.problems


def _problems(tmp_path: Path, model_path, peft=None, **top) -> dict[str, str]:
    found = _problem_list(tmp_path, model_path, peft, **top)
    assert len({p.path for p in found}) == len(found), found  # each problem once
    return {p.path: f"{p.message} | {p.hint}" for p in found}


def test_adapter_path_plans_its_base_and_takes_its_shape(tmp_path):
    folder = _adapter(tmp_path)
    plan = _compile(tmp_path, folder, {"method": "lora", "dropout": 0.1})
    assert plan.model_load.adapter == str(folder)
    assert plan.model_load.path == str(tmp_path / "base") == plan.recipe.model.path
    peft = plan.recipe.peft
    assert (peft.method, peft.r, peft.alpha, sorted(peft.target_modules)) == ("lora", 4, 8, ["q_proj", "v_proj"])
    assert peft.dropout == 0.1  # a training setting: the recipe's applies
    assert plan.tokenizer_path == str(folder)  # final/ holds the tokenizer the adapter was trained with
    assert any(f"continuing the lora adapter {folder}" in n for n in plan.notes)


def test_the_record_names_the_base_and_a_relative_one_resolves_from_the_working_directory(tmp_path, monkeypatch):
    folder = _adapter(tmp_path, record={"base_model": "base", "task": "causal-lm"}, base="elsewhere/gone")
    monkeypatch.chdir(tmp_path)
    assert _compile(tmp_path, folder).model_load.path == str(tmp_path / "base")


def test_no_tokenizer_in_the_adapter_folder_means_the_bases(tmp_path):
    folder = _adapter(tmp_path, tokenizer=False)
    assert _compile(tmp_path, folder).tokenizer_path == str(tmp_path / "base")


def test_a_missing_base_is_located_at_model_path(tmp_path):
    folder = _adapter(tmp_path, base=str(tmp_path / "moved"))
    found = _problems(tmp_path, folder)
    assert list(found) == ["model.path"]
    assert found["model.path"].startswith("the base model of the adapter being continued is not found: "
                                          f"{tmp_path / 'moved'}, as {folder}/adapter_config.json names it")
    assert "ftune merge" in found["model.path"]


def test_a_set_shape_key_that_differs_is_refused_and_unset_ones_are_not(tmp_path):
    folder = _adapter(tmp_path)
    found = _problems(tmp_path, folder, {"method": "lora", "r": 8, "alpha": 8, "target_modules": ["q_proj"]})
    assert sorted(found) == ["peft.r", "peft.target_modules"]
    assert found["peft.r"] == (f"peft.r is 8, but the adapter being continued ({folder}) has r=4 | remove peft.r "
                               "(it is taken from the adapter), or point model.path at a base model to train a "
                               "new adapter")
    assert '["q_proj"]' in found["peft.target_modules"] and '["q_proj", "v_proj"]' in found["peft.target_modules"]


def test_another_method_is_refused_at_peft_method(tmp_path):
    folder = _adapter(tmp_path)
    found = _problems(tmp_path, folder, {"method": "prefix"})
    assert found == {"peft.method": f"the adapter being continued ({folder}) is a lora adapter; peft.method is "
                                    "prefix | set `peft.method: lora` (or remove the peft section), or point "
                                    "model.path at a base model to train a new adapter"}


def test_without_a_peft_section_the_adapters_method_is_taken(tmp_path):
    folder = _adapter(tmp_path, {"peft_type": "PREFIX_TUNING", "task_type": "CAUSAL_LM", "num_virtual_tokens": 6,
                                 "prefix_projection": False})
    peft = _compile(tmp_path, folder).recipe.peft
    assert (peft.method, peft.num_virtual_tokens) == ("prefix", 6)


@pytest.mark.parametrize(("method", "peft"), [("full", {"method": "full"}),
                                              ("freeze", {"method": "freeze", "trainable": ["lm_head"]})])
def test_full_and_freeze_are_told_to_merge_first(tmp_path, method, peft):
    folder = _adapter(tmp_path)
    found = _problems(tmp_path, folder, peft)
    assert list(found) == ["peft.method"]
    assert found["peft.method"].startswith(f"peft.method {method} trains the model's own weights, but model.path "
                                           f"({folder}) is an adapter")
    assert "`ftune merge RUN_DIR`" in found["peft.method"] and "`peft.method: lora`" in found["peft.method"]


def test_other_refusals_are_located(tmp_path):
    folder = _adapter(tmp_path, record={"task": "sequence-classification", "base_model": str(tmp_path / "base")})
    found = _problems(tmp_path, folder, {"method": "lora", "init": "pissa"}, model={"path": str(folder),
                                                                                     "init": "random"})
    assert sorted(found) == ["model.init", "model.task", "peft.init"]
    assert "trained for model.task sequence-classification" in found["model.task"]
    ia3 = _adapter(tmp_path / "ia3", {"peft_type": "IA3", "task_type": "CAUSAL_LM"})
    assert "holds an adapter of peft type IA3, which ftune can't continue" in _problems(tmp_path, ia3)["model.path"]
    (folder / "adapter_model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    truncated = [p for p in _problem_list(tmp_path, folder) if p.path == "model.path"]
    assert len(truncated) == 1 and "adapter_model.safetensors is truncated" in truncated[0].message
    (folder / "adapter_model.safetensors").unlink()
    (folder / "adapter_config.json").write_text('{"peft_type": ')
    assert "is not valid JSON" in _problems(tmp_path, folder)["model.path"]


def test_ftune_plan_shows_the_adapter_and_estimates_on_its_base(tmp_path, capsys, tiny_model_dir, text_data_file):
    from ftune.cli.main import main

    folder = _adapter(tmp_path, {**LORA, "base_model_name_or_path": str(tiny_model_dir)}, tokenizer=False)
    recipe = {"name": "second", "model": {"path": str(folder)}, "data": {"train": [{"path": str(text_data_file)}]},
              "train": {"max_steps": 2}, "output": {"dir": str(tmp_path / "runs" / "second")}}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(recipe))
    assert main(["plan", str(path), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["model_load"]["adapter"], out["model_load"]["path"]) == (str(folder), str(tiny_model_dir))
    assert out["estimate"]["model"] == str(tiny_model_dir)
    # r=4 on q_proj (64 -> 64) and v_proj (64 -> 32, grouped KV) in 2 layers: the adapter's shape, not r=8
    assert out["estimate"]["params_trainable"] == 2 * ((64 + 64) * 4 + (64 + 32) * 4)
    assert any("continuing the lora adapter" in n for n in out["notes"])


def test_an_adapter_with_layers_the_base_lacks_is_refused_not_trained_fresh(tmp_path, tiny_model_dir):
    """peft only warns when a saved LoRA tensor matches no module: the peft stage refuses instead of training those
    layers on from a fresh init."""
    from types import SimpleNamespace

    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from ftune.errors import FtuneError
    from ftune.worker.peft import continue_adapter

    config = AutoConfig.from_pretrained(tiny_model_dir)
    deeper = AutoConfig.from_pretrained(tiny_model_dir, num_hidden_layers=config.num_hidden_layers + 1)
    saved = tmp_path / "final"
    get_peft_model(AutoModelForCausalLM.from_config(deeper),
                   LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).save_pretrained(str(saved))
    plan = SimpleNamespace(model_load=SimpleNamespace(adapter=str(saved), path=str(tiny_model_dir)),
                           recipe=SimpleNamespace(peft=SimpleNamespace(dropout=0.0)))
    with pytest.raises(FtuneError) as err:
        continue_adapter(AutoModelForCausalLM.from_pretrained(tiny_model_dir), plan)
    last = config.num_hidden_layers  # the layer the base lacks
    assert "4 adapter tensors have no place in it" in err.value.message
    assert f"layers.{last}." in err.value.message and "point model.path at a base model" in err.value.hint


def _moe_adapter(tmp_path: Path, base: Path, modules: list[str], parameters: list[str] | None) -> Path:
    folder = tmp_path / "moe-first" / "final"
    folder.mkdir(parents=True)
    cfg = {**LORA, "target_modules": modules, "base_model_name_or_path": str(base)}
    if parameters:
        cfg["target_parameters"] = parameters
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    (folder / "tokenizer.json").write_text("{}")
    return folder


EXPERTS = ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]


@pytest.mark.parametrize(("modules", "parameters", "adds"), [
    (["q_proj", "v_proj"], EXPERTS, "k_proj, o_proj, q_proj, v_proj"),  # trained with experts: true
    (["k_proj", "o_proj", "q_proj", "v_proj"], None, "target_parameters mlp.experts.down_proj"),  # attention only
])
def test_all_linear_that_would_change_an_moe_adapters_targets_is_refused(tmp_path, tiny_qwen3_moe_dir, modules,
                                                                        parameters, adds):
    """On an MoE, all-linear means attention and the experts (target_parameters): over an adapter that adapts
    other targets it is refused at the key, naming both sides, instead of silently continuing something else."""
    folder = _moe_adapter(tmp_path, tiny_qwen3_moe_dir, modules, parameters)
    found = _problems(tmp_path, folder, {"method": "lora", "target_modules": "all-linear"})
    assert list(found) == ["peft.target_modules"]
    message, hint = found["peft.target_modules"].split(" | ")
    assert message.startswith("all-linear on Qwen3MoeForCausalLM adapts target_modules k_proj, o_proj, q_proj, "
                              "v_proj and target_parameters mlp.experts.down_proj, mlp.experts.gate_up_proj, but "
                              f"the adapter being continued ({folder}) adapts target_modules {', '.join(modules)}")
    assert adds in message and message.endswith("a continued adapter keeps its targets")
    assert hint == ("remove peft.target_modules (the adapter's targets are kept), or point model.path at the base "
                    "model to train a new adapter with all-linear")
    plan = _compile(tmp_path, folder, {"method": "lora"})  # the fix the hint gives
    assert plan.recipe.peft.target_modules == modules


def test_all_linear_over_the_adapter_it_trained_continues(tmp_path, tiny_qwen3_moe_dir):
    """The recipe that trained the adapter continues it: all-linear resolves, on the model, to the adapter's
    targets (on the MoE: attention + experts; on a dense model: every linear layer but the head)."""
    moe = _moe_adapter(tmp_path, tiny_qwen3_moe_dir, ["k_proj", "o_proj", "q_proj", "v_proj"], EXPERTS)
    plan = _compile(tmp_path, moe, {"method": "lora", "target_modules": "all-linear"})
    assert plan.recipe.peft.target_modules == ["k_proj", "o_proj", "q_proj", "v_proj"]
    assert plan.recipe.peft.target_parameters == EXPERTS
    dense = _adapter(tmp_path / "dense", {**LORA, "target_modules": ["down_proj", "gate_proj", "k_proj", "o_proj",
                                                                     "q_proj", "up_proj", "v_proj"]})
    plan = _compile(tmp_path, dense, {"method": "lora", "target_modules": "all-linear"})
    assert plan.model_load.adapter == str(dense)
    found = _problems(tmp_path, _adapter(tmp_path / "dense2"), {"method": "lora", "target_modules": "all-linear"})
    assert "all-linear on LlamaForCausalLM adapts target_modules down_proj, gate_proj" in found["peft.target_modules"]
