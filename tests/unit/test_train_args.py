"""The compiler builds the exact TrainingArguments kwargs (`plan.trainer`); the worker passes them through unchanged."""

from __future__ import annotations

import pytest
import yaml

from ftune.errors import RecipeError
from ftune.plan.compile import compile_plan
from ftune.recipe import load_recipe
from ftune.runtime.train import classification_metrics, training_arguments


def _plan(tmp_path, gpus: int | None = None, **sections):
    raw = {"name": "t", "model": {"path": "m"}, "data": {"train": [{"path": "d.jsonl"}], "eval": {"split": 0.1}},
           "train": {"max_steps": 10}, "output": {"dir": str(tmp_path / "run")}}
    raw.update(sections)
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(raw))
    return compile_plan(load_recipe(path), check_inputs=False, gpus=gpus)


def test_worker_builds_training_arguments_from_the_plan_unchanged(tmp_path):
    plan = _plan(tmp_path, train={"max_steps": 50, "learning_rate": 1e-3, "optimizer": "adamw_torch_fused",
                                  "optimizer_args": {"betas": [0.9, 0.95], "eps": 1e-6}},
                 eval={"strategy": "steps", "steps": 20}, checkpoint={"steps": 20})
    args = training_arguments(plan)
    for key, value in plan.trainer.items():
        got = getattr(args, key)
        got = getattr(got, "value", got)  # enums (strategies, scheduler type, optim)
        if key == "report_to":
            value = [value] if isinstance(value, str) else value
        assert got == value, key
    assert (args.adam_beta1, args.adam_beta2, args.adam_epsilon) == (0.9, 0.95, 1e-6)


def test_plan_json_holds_the_trainer_and_model_loading_dicts(tmp_path):
    plan = _plan(tmp_path, model={"path": "m", "dtype": "bfloat16", "attn_implementation": "sdpa"},
                 quantization={"bits": 4, "compute_dtype": "bfloat16"}, train={"max_steps": 3, "mixed_precision": "bf16"})
    data = plan.model_dump(mode="json")
    assert data["trainer"]["max_steps"] == 3 and data["trainer"]["bf16"] is True
    assert data["trainer"]["output_dir"] == str(tmp_path / "run" / "checkpoints")
    load = data["model_load"]
    assert (load["auto_class"], load["path"], load["init"]) == ("AutoModelForCausalLM", "m", "pretrained")
    assert load["kwargs"]["dtype"] == "bfloat16" and load["kwargs"]["attn_implementation"] == "sdpa"
    assert load["kwargs"]["quantization_config"]["load_in_4bit"] is True
    assert load["kwargs"]["quantization_config"]["bnb_4bit_compute_dtype"] == "bfloat16"


def test_optimizer_args_reach_the_trainer(tmp_path):
    plan = _plan(tmp_path, gpus=0, train={"max_steps": 1, "optimizer": "galore_adamw",  # galore-torch: not needed
                                  "optimizer_args": {"target_modules": ["q_proj", "v_proj"], "rank": 64,
                                                     "update_proj_gap": 200, "scale": 0.25}})
    t = plan.trainer
    assert t["optim_target_modules"] == ["q_proj", "v_proj"]
    assert sorted(t["optim_args"].split(",")) == ["rank=64", "scale=0.25", "update_proj_gap=200"]


def test_scheduler_args_reach_the_trainer(tmp_path):
    plan = _plan(tmp_path, train={"max_steps": 1, "lr_scheduler": "cosine_with_min_lr",
                                  "lr_scheduler_args": {"min_lr": 1e-6}})
    assert plan.trainer["lr_scheduler_kwargs"] == {"min_lr": 1e-6}


def test_epochs_default_is_the_same_for_plan_and_worker(tmp_path):
    plan = _plan(tmp_path, train={"epochs": 2})
    assert plan.trainer["num_train_epochs"] == 2 and plan.trainer["max_steps"] == -1


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


def test_missing_optional_optimizer_package_is_a_located_plan_error(tmp_path):
    import importlib.util

    if importlib.util.find_spec("galore_torch") is not None:
        pytest.skip("galore-torch is installed here")
    with pytest.raises(RecipeError) as info:
        _plan(tmp_path, train={"max_steps": 1, "optimizer": "galore_adamw", "optimizer_args": {"target_modules": ["x"]}})
    [p] = info.value.problems
    assert p.path == "train.optimizer" and "galore-torch" in p.message and "pip install 'galore-torch'" in p.hint
    assert p.location.line is not None


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


def test_eval_arguments_of_a_distributed_plan_run_in_one_process(tmp_path):
    from ftune.runtime.train import eval_arguments

    plan = _plan(tmp_path, distributed={"strategy": "fsdp", "num_processes": 2}, peft={"method": "full"})
    assert plan.trainer["fsdp"] is True and plan.trainer["ddp_backend"] == "gloo"
    args = eval_arguments(plan)  # would try to join the launch's process group with the FSDP/DDP kwargs
    assert not args.fsdp and args.ddp_backend is None and args.output_dir.endswith("eval-tmp")
