"""Preference objectives: the rules refuse what TRL can't run (located), the Plan holds kwargs TRL's config
classes accept unchanged, a missing trl is a located plan error, and preference rows become TRL's columns."""

from __future__ import annotations

import importlib.util
import json

import pytest
import yaml

from ftune.errors import RecipeError
from ftune.plan.compile import compile_plan
from ftune.recipe import load_recipe
from ftune.recipe.objectives import OBJECTIVES

PAIRS = [{"path": "p.jsonl", "format": "preference"}]
UNPAIRED = [{"path": "k.jsonl", "format": "unpaired-preference"}]


def _write(tmp_path, train: dict, data: dict | None = None, **top) -> str:
    raw = {"name": "t", "model": {"path": "m"},
           "data": {"train": PAIRS, "eval": {"split": 0.1}, "max_seq_length": 64, **(data or {})},
           "train": {"max_steps": 10, **train}, "output": {"dir": str(tmp_path / "run")}, **top}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


def problems(tmp_path, train: dict, data: dict | None = None, **top) -> dict:
    with pytest.raises(RecipeError) as err:
        load_recipe(_write(tmp_path, train, data, **top))
    return {p.path: p for p in err.value.problems}


def plan(tmp_path, train: dict, data: dict | None = None, **top):
    return compile_plan(load_recipe(_write(tmp_path, train, data, **top)), check_inputs=False)


# ------------------------------------------------------------------------------ rules, located
def test_reference_is_refused_for_reference_free_objectives(tmp_path):
    for name in ("orpo", "simpo"):
        p = problems(tmp_path, {"objective": name, "preference": {"reference": "precomputed"}})
        assert list(p) == ["train.preference.reference"]
        assert p["train.preference.reference"].message.startswith(f"{name} is reference-free")
        loc = p["train.preference.reference"].location  # the key as written
        assert open(loc.file).read().splitlines()[loc.line - 1].strip() == "reference: precomputed"


def test_settings_of_another_objective_are_refused(tmp_path):
    p = problems(tmp_path, {"objective": "orpo", "preference": {"beta": 0.2, "gamma": 0.5, "loss_type": "ipo"}})
    assert sorted(p) == ["train.preference.gamma", "train.preference.loss_type"]
    assert "used by: simpo" in p["train.preference.gamma"].message


def test_unknown_loss_type_is_refused_per_objective(tmp_path):
    p = problems(tmp_path, {"objective": "dpo", "preference": {"loss_type": "kto"}})
    assert p["train.preference.loss_type"].message == "dpo has no loss_type 'kto'"
    assert "ipo" in p["train.preference.loss_type"].hint
    load_recipe(_write(tmp_path, {"objective": "kto", "per_device_batch_size": 2, "preference": {"loss_type": "kto"}},
                       {"train": UNPAIRED}))


def test_kto_kl_term_needs_a_batch_of_two_in_a_fixed_order(tmp_path):
    p = problems(tmp_path, {"objective": "kto", "group_by_length": True}, {"train": UNPAIRED})
    assert sorted(p) == ["train.group_by_length", "train.per_device_batch_size"]
    assert p["train.per_device_batch_size"].message == ("kto estimates its KL term from the other rows of a batch; a "
                                                        "per-device batch of 1 has none")
    assert "apo_zero_unpaired" in p["train.per_device_batch_size"].hint
    # apo_zero_unpaired has no KL term: batch 1 and any order are fine, and the sampler stays random
    free = plan(tmp_path, {"objective": "kto", "group_by_length": True, "preference": {"loss_type": "apo_zero_unpaired"}},
                {"train": UNPAIRED})
    assert free.trainer["train_sampling_strategy"] == "group_by_length"
    kto = plan(tmp_path, {"objective": "kto", "per_device_batch_size": 2}, {"train": UNPAIRED})
    assert kto.trainer["train_sampling_strategy"] == "sequential"  # TRL refuses any other for its KL pairing


def test_preference_needs_a_preference_objective_and_matching_data(tmp_path):
    p = problems(tmp_path, {"preference": {"beta": 0.1}})
    assert p["train.preference"].message.startswith("train.preference sets")
    assert p["data.train[0].format"].message == "preference data needs a preference objective, but train.objective is 'sft'"
    p = problems(tmp_path, {"objective": "kto"})
    assert p["data.train[0].format"].message == "train.objective 'kto' reads `format: unpaired-preference` rows, not preference"
    p = problems(tmp_path, {"objective": "dpo"}, {"train": [{"path": "d.jsonl", "format": "instruction"}]})
    assert "{prompt, chosen, rejected}" in p["data.train[0].format"].hint


def test_what_a_preference_trainer_cannot_do_is_refused(tmp_path):
    p = problems(tmp_path, {"objective": "dpo", "neftune_alpha": 5.0},
                 {"packing": True, "train_on": "all", "max_prompt_length": 64})
    assert sorted(p) == ["data.max_prompt_length", "data.packing", "data.train_on", "train.neftune_alpha"]
    assert "leaves no room" in p["data.max_prompt_length"].message
    p = problems(tmp_path, {}, {"train": [{"path": "d.jsonl"}], "max_prompt_length": 16})
    assert list(p) == ["data.max_prompt_length"]


# ------------------------------------------------------------------------------ the Plan
def test_plan_names_the_trl_classes_and_writes_every_default(tmp_path):
    p = plan(tmp_path, {"objective": "dpo", "learning_rate": 1e-5})
    assert (p.config_class, p.trainer_class) == ("trl.DPOConfig", "trl.DPOTrainer")
    t = p.trainer
    assert (t["beta"], t["loss_type"], t["label_smoothing"], t["precompute_ref_log_probs"]) == (0.1, ["sigmoid"], 0.0,
                                                                                                 False)
    assert (t["max_length"], t["disable_dropout"], t["learning_rate"]) == (64, True, 1e-5)
    assert any(n.startswith("dpo reference: the base model with the adapter disabled") for n in p.notes)
    s = plan(tmp_path, {"objective": "simpo", "preference": {"gamma": 1.0}}).trainer
    assert (s["loss_type"], s["cpo_alpha"], s["beta"], s["simpo_gamma"]) == ("simpo", 0.0, 2.0, 1.0)
    sft = plan(tmp_path, {}, {"train": [{"path": "d.jsonl"}]})
    assert (sft.config_class, sft.trainer_class) == ("transformers.TrainingArguments", "transformers.Trainer")
    assert "beta" not in sft.trainer


def test_full_fine_tuning_reference_is_a_counted_copy(tmp_path):
    p = plan(tmp_path, {"objective": "dpo"}, peft={"method": "full"})
    assert any("frozen copy of the model" in n for n in p.notes)
    p = plan(tmp_path, {"objective": "dpo", "preference": {"reference": "precomputed"}}, peft={"method": "full"})
    assert p.trainer["precompute_ref_log_probs"] is True and any("precomputed" in n for n in p.notes)


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl not installed")
@pytest.mark.parametrize("name,data,pref", [
    ("dpo", PAIRS, {"beta": 0.2, "loss_type": "ipo", "reference": "precomputed"}),
    ("orpo", PAIRS, {"beta": 0.3}),
    ("kto", UNPAIRED, {"desirable_weight": 1.5, "loss_type": "apo_zero_unpaired"}),
    ("kto", UNPAIRED, {"loss_type": "kto", "beta": 0.5}),
    ("simpo", PAIRS, {"label_smoothing": 0.1}),
])
def test_trl_config_class_takes_plan_trainer_unchanged(tmp_path, name, data, pref):
    from ftune.runtime.train import training_arguments

    p = plan(tmp_path, {"objective": name, "preference": pref, "per_device_batch_size": 2}, {"train": data})
    args = training_arguments(p)
    assert f"{type(args).__module__.split('.')[0]}.{type(args).__name__}" == f"trl.{OBJECTIVES[name].config_class}"
    for key, value in p.trainer.items():
        got = getattr(args, key)
        got = getattr(got, "value", got)
        if key == "report_to":
            value = [value] if isinstance(value, str) else value
        assert got == value, key
    assert args.activation_checkpointing is False and args.bf16 is False  # TRL's own defaults overridden


def test_missing_trl_is_a_located_plan_error(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trl" else real(name, *a))
    with pytest.raises(RecipeError) as err:
        plan(tmp_path, {"objective": "dpo"})
    [p] = err.value.problems
    assert p.path == "train.objective" and "trl is not installed" in p.message
    assert "pip install 'ftune[preference]'" in p.hint and p.location.line is not None


# ------------------------------------------------------------------------------ data
def _bundle(tmp_path, tokenizer_dir, rows, fmt="preference", **data):
    from transformers import AutoTokenizer

    from tests.data_stage import build

    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    objective = "kto" if fmt == "unpaired-preference" else "dpo"
    recipe = load_recipe(_write(tmp_path, {"objective": objective, "per_device_batch_size": 2},
                                {"train": [{"path": str(tmp_path / "d.jsonl"), "format": fmt}], "eval": None,
                                 "shuffle": False, **data})).recipe
    return build(recipe, AutoTokenizer.from_pretrained(tokenizer_dir), log=lambda *a: None)


def test_string_pairs_keep_prompt_and_completions(tmp_path, tiny_tokenizer_dir):
    rows = [{"prompt": f"User: q{i}\nAssistant:", "chosen": " yes", "rejected": " no"} for i in range(4)]
    b = _bundle(tmp_path, tiny_tokenizer_dir, rows)
    assert b.collator is None and b.train.column_names == ["prompt", "chosen", "rejected"]
    assert b.train[0] == {"prompt": "User: q0\nAssistant:", "chosen": " yes", "rejected": " no"}
    assert b.report.train_samples == 4 and b.report.trainable_tokens > 0


def test_chat_pairs_are_rendered_with_the_template_and_prompts_truncated_at_the_start(tmp_path, tiny_tokenizer_dir):
    long = " ".join(["the cat sat on a mat"] * 10)
    rows = [{"prompt": [{"role": "user", "content": long}], "chosen": [{"role": "assistant", "content": "yes"}],
             "rejected": [{"role": "assistant", "content": "no"}]}]
    b = _bundle(tmp_path, tiny_tokenizer_dir, rows, max_prompt_length=16)
    row = b.train[0]
    assert row["prompt"].endswith("<|assistant|>\n") and not row["prompt"].startswith("<|user|>")
    assert (row["chosen"], row["rejected"]) == ("yes</s>", "no</s>")
    assert b.report.truncated == 1


def test_unpaired_rows_need_a_boolean_label(tmp_path, tiny_tokenizer_dir):
    from ftune.datastage import DataError

    ok = [{"prompt": "q", "completion": " yes", "label": True}, {"prompt": "q", "completion": " no", "label": False}]
    b = _bundle(tmp_path, tiny_tokenizer_dir, ok, fmt="unpaired-preference")
    assert b.train["label"] == [True, False] and b.train.column_names == ["prompt", "completion", "label"]
    with pytest.raises(DataError) as err:
        _bundle(tmp_path, tiny_tokenizer_dir, [{"prompt": "q", "completion": " yes", "label": "good"}],
                fmt="unpaired-preference", cache_dir=str(tmp_path / "c2"))
    assert "row 1" in err.value.message and "must be true or false" in err.value.message
    assert err.value.location.line == 1


def test_ftune_data_shows_the_prompt_masked_and_both_completions_trained(tmp_path, tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    from ftune.cli.data import preference_samples

    rows = [{"prompt": "User: q\nAssistant:", "chosen": " yes", "rejected": " no"}]
    b = _bundle(tmp_path, tiny_tokenizer_dir, rows)
    shown = preference_samples(AutoTokenizer.from_pretrained(tiny_tokenizer_dir), b.train, 5)
    assert [s["completion"] for s in shown] == ["chosen", "rejected"]
    assert [[(r["text"], r["trained"]) for r in s["runs"]] for s in shown] == [
        [("User: q\nAssistant:", False), (" yes", True)], [("User: q\nAssistant:", False), (" no", True)]]
