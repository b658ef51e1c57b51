"""Recipe fields map onto TrainingArguments exactly; optional optimizers fail with an install hint."""

from __future__ import annotations

import pytest

from ftune.errors import FtuneError
from ftune.plan.model import LaunchSpec, Plan
from ftune.recipe.schema import Recipe
from ftune.worker.train import check_optimizer, classification_metrics, training_arguments


def _plan(tmp_path, **sections) -> Plan:
    raw = {"name": "t", "model": {"path": "m"}, "data": {"train": [{"path": "d.jsonl"}], "eval": {"split": 0.1}},
           "train": {"max_steps": 10}}
    raw.update(sections)
    return Plan(ftune_version="0", recipe_file=str(tmp_path / "r.yaml"), recipe=Recipe.model_validate(raw),
                run_dir=str(tmp_path / "run"), device="cpu", num_processes=1, num_machines=1, machine_rank=0,
                world_size=1, torch_dtype="float32", mixed_precision=raw.get("train", {}).get("mixed_precision", "no"),
                effective_batch_size=1, tokenizer_path="m", launch=LaunchSpec(accelerate_config={}, command=[]))


def test_fields_map_onto_training_arguments(tmp_path):
    plan = _plan(tmp_path, train={"max_steps": 50, "learning_rate": 1e-3, "lr_scheduler": "cosine",
                                  "warmup_ratio": 0.1, "weight_decay": 0.01, "per_device_batch_size": 3,
                                  "gradient_accumulation_steps": 4, "max_grad_norm": 0.5, "seed": 11,
                                  "logging_steps": 7, "neftune_alpha": 5.0, "mixed_precision": "bf16",
                                  "log_level": "info", "log_level_replica": "error"},
                 eval={"strategy": "steps", "steps": 20, "batch_size": 6},
                 checkpoint={"strategy": "steps", "steps": 25, "keep": 2})
    args = training_arguments(plan)
    assert args.max_steps == 50 and args.learning_rate == 1e-3
    assert args.lr_scheduler_type.value == "cosine"
    assert args.warmup_steps == 0.1 and args.get_warmup_steps(50) == 5  # a ratio: ceil(50 * 0.1)
    assert (args.weight_decay, args.max_grad_norm, args.seed, args.logging_steps) == (0.01, 0.5, 11, 7)
    assert (args.per_device_train_batch_size, args.per_device_eval_batch_size) == (3, 6)
    assert args.gradient_accumulation_steps == 4
    assert args.neftune_noise_alpha == 5.0 and args.bf16 and not args.fp16
    assert args.eval_strategy.value == "steps" and args.eval_steps == 20 and not args.eval_on_start
    assert args.save_steps == 25 and args.save_total_limit == 2
    assert args.use_cpu and args.output_dir.endswith("run/checkpoints")
    assert (args.log_level, args.log_level_replica) == ("info", "error")


def test_warmup_steps_are_steps(tmp_path):
    args = training_arguments(_plan(tmp_path, train={"max_steps": 100, "warmup_steps": 30}))
    assert args.get_warmup_steps(100) == 30


def test_early_stopping_loads_best_and_watches_the_metric(tmp_path):
    plan = _plan(tmp_path, train={"max_steps": 10, "early_stopping": {"patience": 2, "metric": "eval_loss"}},
                 eval={"strategy": "steps", "steps": 5}, checkpoint={"steps": 5})
    args = training_arguments(plan)
    assert args.load_best_model_at_end and args.metric_for_best_model == "eval_loss"
    assert args.greater_is_better is False


def test_accuracy_metric_is_maximised(tmp_path):
    plan = _plan(tmp_path, train={"max_steps": 10, "early_stopping": {"metric": "eval_accuracy"}},
                 eval={"strategy": "steps", "steps": 5}, checkpoint={"steps": 5})
    assert training_arguments(plan).greater_is_better is True


def test_no_eval_data_means_no_eval(tmp_path):
    plan = _plan(tmp_path, data={"train": [{"path": "d.jsonl"}]})
    args = training_arguments(plan)
    assert args.eval_strategy.value == "no" and args.metric_for_best_model is None


def test_unknown_optimizer_suggests_names():
    with pytest.raises(FtuneError) as info:
        check_optimizer("adamw_troch")
    assert "unknown optimizer 'adamw_troch'" in info.value.message
    assert "adamw_torch" in info.value.hint


def test_missing_optional_optimizer_package_gives_install_hint():
    import importlib.util

    if importlib.util.find_spec("galore_torch") is not None:
        pytest.skip("galore-torch is installed here")
    with pytest.raises(FtuneError) as info:
        check_optimizer("galore_adamw")
    assert "galore-torch" in info.value.message and "pip install galore-torch" in info.value.hint


def test_classification_metrics_values():
    import numpy as np

    logits = np.array([[2.0, 0.0], [0.0, 1.0], [3.0, 1.0], [0.0, 2.0]])
    labels = np.array([0, 1, 1, 1])
    m = classification_metrics((logits, labels))
    assert m["accuracy"] == pytest.approx(0.75)
    # class 0: tp1 fp1 fn0 -> 2/3 ; class 1: tp2 fp0 fn1 -> 0.8
    assert m["f1"] == pytest.approx((2 / 3 + 0.8) / 2)


def test_eval_on_start(tmp_path):
    plan = _plan(tmp_path, eval={"strategy": "steps", "steps": 5, "on_start": True})
    assert training_arguments(plan).eval_on_start is True
    only_start = _plan(tmp_path, eval={"strategy": "no", "on_start": True})
    assert training_arguments(only_start).eval_on_start is True
