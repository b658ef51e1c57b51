"""The keys real-world recipes needed: chat templates by name, per-epoch schedules, tokens, split slices, LoRA
initialisation, the distributed timeout and tracker settings — each refused, located, where it can't work, and
compiled into the Plan where it is a decision."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from ftune.errors import RecipeError
from ftune.plan.compile import compile_plan
from ftune.recipe import load_recipe
from ftune.recipe.schedule import per_epoch_ratio

BASE = {"name": "t", "model": {"path": "m"}, "data": {"train": [{"path": "d.jsonl"}], "eval": {"split": 0.1}},
        "train": {"epochs": 3}}


def write(tmp_path, **sections) -> str:
    recipe = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    for key, value in sections.items():
        recipe[key] = {**recipe[key], **value} if isinstance(recipe.get(key), dict) else value
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return str(path)


def problems(tmp_path, **sections):
    with pytest.raises(RecipeError) as err:
        load_recipe(write(tmp_path, **sections))
    return {p.path: p for p in err.value.problems}


def plan(tmp_path, **sections):
    return compile_plan(load_recipe(write(tmp_path, **sections)), check_inputs=False, gpus=0)


# ------------------------------------------------------------------------------ chat templates
def test_chat_template_typo_gets_the_built_in_names(tmp_path):
    p = problems(tmp_path, data={"chat_template": "chatlm"})["data.chat_template"]
    assert p.message == "unknown chat template 'chatlm'"
    assert "did you mean 'chatml'" in p.hint and "llama3, chatml, mistral, gemma, phi3, qwen, qwen3, alpaca" in p.hint
    assert p.location.line is not None


def test_a_jinja_chat_template_must_parse(tmp_path):
    p = problems(tmp_path, data={"chat_template": "{% for m in messages %}{{ m.content }}"})["data.chat_template"]
    assert "does not parse" in p.message and "endfor" in p.message


def test_transformers_generation_tags_parse(tmp_path):
    template = "{% for m in messages %}{% generation %}{{ m.content }}{%- endgeneration -%}{% endfor %}"
    assert load_recipe(write(tmp_path, data={"chat_template": template})).recipe.data.chat_template == template


def test_as_chat_is_for_instruction_rows(tmp_path):
    found = problems(tmp_path, data={"train": [{"path": "d.jsonl", "format": "text", "as_chat": True}]})
    assert "format is 'text'" in found["data.train[0].as_chat"].message


# ------------------------------------------------------------------------------ split slices
@pytest.mark.parametrize("split", ["train[:20%]", "train[10:-5]", "train[:50%]+train[-10%:]"])
def test_slices_validate(tmp_path, split):
    assert load_recipe(write(tmp_path, data={"train": [{"path": "d.jsonl", "split": split}]})).recipe


def test_bad_slices_are_located(tmp_path):
    found = problems(tmp_path, data={"train": [{"path": "d.jsonl", "split": "train[:20%"},
                                               {"path": "e.jsonl", "split": "test[:10]"}]})
    assert "'train[:20%' is no split or slice" in found["data.train[0].split"].message
    assert "a file holds one split, `train`" in found["data.train[1].split"].message


def test_slice_selects_rows_as_datasets_does(tmp_path):
    import datasets

    from ftune.datafiles.sources import sliced, split_names

    ds = datasets.Dataset.from_dict({"x": list(range(103))})
    assert sliced({"train": ds}, "train[:20%]")["x"] == list(range(21))  # datasets rounds 20.6 to 21
    assert sliced({"train": ds, "test": ds}, "train[:2]+test[-1:]")["x"] == [0, 1, 102]
    assert split_names("train[:2]+test[-1:]") == ["train", "test"]


# ------------------------------------------------------------------------------ per-epoch schedules
def test_per_epoch_compiles_to_ratios_of_the_total_steps(tmp_path):
    p = plan(tmp_path, eval={"per_epoch": 4}, checkpoint={"per_epoch": 2, "load_best": True})
    t = p.trainer
    assert (t["eval_strategy"], t["save_strategy"]) == ("steps", "steps")
    assert t["eval_steps"] == pytest.approx(1 / 12) and t["eval_steps"] <= 1 / 12
    assert t["save_steps"] == pytest.approx(1 / 6)
    assert t["load_best_model_at_end"] is True


@pytest.mark.parametrize("total", [12, 24, 30, 36, 120, 1200, 12000])
def test_a_ratio_gives_the_intended_whole_steps(total):
    """transformers evaluates every ceil(total * ratio) steps: exact divisions must not round up."""
    _, ratio = per_epoch_ratio(4, 3)
    assert math.ceil(total * ratio) == math.ceil(total / 12)


def test_once_per_run_is_the_epoch_strategy():
    assert per_epoch_ratio(1, 1) == ("epoch", None)
    assert per_epoch_ratio(2, 0.5) == ("epoch", None)
    assert per_epoch_ratio(1, 2)[0] == "steps"


def test_per_epoch_needs_epochs_and_no_steps(tmp_path):
    steps = problems(tmp_path, train={"max_steps": 10}, eval={"per_epoch": 2})
    assert steps["eval.per_epoch"].message == "eval.per_epoch counts epochs, but the run's length is train.max_steps"
    both = problems(tmp_path, checkpoint={"per_epoch": 2, "steps": 5})
    assert both["checkpoint.per_epoch"].message == "can't set both `checkpoint.steps` and `checkpoint.per_epoch`"
    one = problems(tmp_path, eval={"per_epoch": 2, "strategy": "no"})
    assert "contradicts `eval.strategy: no`" in one["eval.per_epoch"].message


def test_per_epoch_eval_needs_eval_data(tmp_path):
    found = problems(tmp_path, data={"eval": None}, eval={"per_epoch": 2})
    assert "no eval data" in found["eval.per_epoch"].message


def test_load_best_needs_saves_on_evaluations(tmp_path):
    mixed = problems(tmp_path, eval={"per_epoch": 4}, checkpoint={"steps": 40, "load_best": True})
    assert "checkpoint.per_epoch: 4" in mixed["checkpoint.strategy"].hint
    off = problems(tmp_path, eval={"per_epoch": 4}, checkpoint={"per_epoch": 3}, train={"epochs": 3,
                                                                                        "early_stopping": {}})
    assert "don't line up" in off["checkpoint.per_epoch"].message


def test_early_stopping_with_per_epoch_builds(tmp_path):
    from transformers import TrainingArguments

    p = plan(tmp_path, eval={"per_epoch": 2}, checkpoint={"per_epoch": 2},
             train={"epochs": 3, "early_stopping": {"patience": 2}})
    args = TrainingArguments(**p.trainer)
    assert args.load_best_model_at_end and args.eval_steps == args.save_steps == p.trainer["eval_steps"]


# ------------------------------------------------------------------------------ tokens
def test_token_rules(tmp_path):
    found = problems(tmp_path, model={"add_tokens": ["<a>", " ", "<a>"], "special_tokens": {"eos_token": ""}},
                     peft={"method": "prefix"})
    assert "empty" in found["model.add_tokens[1]"].message
    assert "listed twice" in found["model.add_tokens[2]"].message
    assert "eos_token can't be empty" in found["model.special_tokens.eos_token"].message
    assert "peft.method 'prefix'" in found["model.add_tokens"].message


# ------------------------------------------------------------------------------ LoRA init
def test_lora_init_rules(tmp_path):
    assert "only fits that new base" in problems(tmp_path, peft={"method": "lora", "init": "loftq"})["peft.init"].message
    q = problems(tmp_path, peft={"method": "lora", "init": "pissa"}, quantization={"bits": 4})
    assert "4-bit base" in q["peft.init"].message
    d = problems(tmp_path, peft={"method": "lora", "init": "olora", "use_dora": True})
    assert "use_dora" in d["peft.init"].message


# ------------------------------------------------------------------------------ timeout, trackers
def test_distributed_timeout_is_the_ddp_timeout(tmp_path):
    assert plan(tmp_path, distributed={"timeout": 7200}).trainer["ddp_timeout"] == 7200
    assert "ddp_timeout" not in plan(tmp_path).trainer


def test_tracker_settings_reach_the_workers_environment(tmp_path):
    p = plan(tmp_path, output={"report_to": ["wandb", "mlflow"], "trackers": {
        "wandb": {"project": "p", "entity": "team", "tags": ["lora", "8b"], "run_name": "r1", "mode": "offline"},
        "mlflow": {"experiment": "e", "tags": {"owner": "me"}, "tracking_uri": "file:/tmp/mlruns"}}})
    env = p.launch.env
    assert {k: env[k] for k in env if k.startswith(("WANDB", "MLFLOW"))} == {
        "WANDB_PROJECT": "p", "WANDB_ENTITY": "team", "WANDB_TAGS": "lora,8b", "WANDB_MODE": "offline",
        "MLFLOW_EXPERIMENT_NAME": "e", "MLFLOW_TAGS": json.dumps({"owner": "me"}),
        "MLFLOW_TRACKING_URI": "file:/tmp/mlruns", "MLFLOW_ALLOW_FILE_STORE": "true"}
    assert p.trainer["run_name"] == "r1" and p.trainer["report_to"] == ["wandb", "mlflow"]
    # MLflow 3 refuses its file store (a file: URI, a path, or its default ./mlruns) unless this is set; not a server's
    server = plan(tmp_path, output={"report_to": ["mlflow"], "trackers": {"mlflow": {"tracking_uri": "http://h:5000"}}})
    assert "MLFLOW_ALLOW_FILE_STORE" not in server.launch.env
    assert plan(tmp_path, output={"report_to": ["mlflow"]}).launch.env["MLFLOW_ALLOW_FILE_STORE"] == "true"


def test_tracker_settings_without_the_tracker_send_nothing_and_are_refused(tmp_path):
    found = problems(tmp_path, output={"report_to": ["tensorboard"], "trackers": {"wandb": {"project": "p"}}})
    assert "nothing would be sent" in found["output.trackers.wandb"].message
    tags = problems(tmp_path, output={"report_to": ["wandb"], "trackers": {"wandb": {"tags": ["a,b"]}}})
    assert "without ','" in tags["output.trackers.wandb.tags[0]"].message
    assert "run_name" not in plan(tmp_path).trainer and not any(k.startswith("WANDB") for k in plan(tmp_path).launch.env)


def test_special_tokens_are_vocabulary_not_secrets(tmp_path):
    from ftune.recipe._secrets import shown_override

    loaded = load_recipe(write(tmp_path, model={"special_tokens": {"eos_token": "<|im_end|>"}, "hub_token": "hf_x"}),
                         ["model.special_tokens.pad_token=<pad>"])
    assert loaded.recipe.model.special_tokens.eos_token == "<|im_end|>"
    assert loaded.recipe.model.special_tokens.pad_token == "<pad>"
    assert loaded.recipe.model.hub_token == "***" and list(loaded.secrets) == ["model.hub_token"]
    assert shown_override("model.special_tokens.eos_token=<e>") == "model.special_tokens.eos_token=<e>"
    assert shown_override("model.hub_token=hf_x") == "model.hub_token=***"
