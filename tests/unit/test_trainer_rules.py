"""`ftune validate` refuses, located, what TrainingArguments / the optimizer / the scheduler would refuse after
launch; the name tables agree with the installed transformers; and every recipe that validates builds them."""

from __future__ import annotations

import inspect
import math

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ftune.errors import RecipeError
from ftune.plan.compile import compile_plan
from ftune.recipe import load_recipe
from ftune.recipe.trainer_names import OPTIMIZERS, SCHEDULER_ARGS

BASE = {"name": "t", "model": {"path": "m"}, "data": {"train": [{"path": "d.jsonl"}], "eval": {"split": 0.1}}}


def write(tmp_path, train: dict, **top) -> str:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({**BASE, "train": {"max_steps": 10, **train}, **top}, sort_keys=False))
    return str(path)


def problems(tmp_path, train: dict, **top):
    with pytest.raises(RecipeError) as err:
        load_recipe(write(tmp_path, train, **top))
    return {p.path: p for p in err.value.problems}


# ------------------------------------------------------------------------------ each rule, located
def test_optimizer_typo_is_refused_with_a_suggestion(tmp_path):
    p = problems(tmp_path, {"optimizer": "adamw_bnb8bit"})["train.optimizer"]
    assert p.message == "unknown optimizer 'adamw_bnb8bit'" and "'adamw_bnb_8bit'" in p.hint
    assert (p.location.line, p.location.column) == (11, 3)


def test_galore_needs_target_modules(tmp_path):
    p = problems(tmp_path, {"optimizer": "galore_adamw"})["train.optimizer"]
    assert "optimizer_args.target_modules" in p.message and "target_modules: [attn, mlp]" in p.hint


def test_target_modules_only_for_low_rank_optimizers(tmp_path):
    found = problems(tmp_path, {"optimizer_args": {"target_modules": ["q_proj"]}})
    assert "galore_*/apollo_*" in found["train.optimizer_args.target_modules"].message


def test_optimizer_args_values(tmp_path):
    found = problems(tmp_path, {"optimizer_args": {"betas": [0.9], "eps": -1, "scale": "a=b"}})
    assert "two numbers in [0, 1)" in found["train.optimizer_args.betas"].message
    assert "positive" in found["train.optimizer_args.eps"].message
    assert "contains ',' or '='" in found["train.optimizer_args.scale"].message


def test_layerwise_optimizer_refused_with_ddp_and_accumulation(tmp_path):
    found = problems(tmp_path, {"optimizer": "galore_adamw_layerwise", "gradient_accumulation_steps": 2,
                                "optimizer_args": {"target_modules": ["attn"]}},
                     distributed={"strategy": "ddp", "num_processes": 2})
    assert "one process only" in found["train.optimizer"].message
    assert "can't accumulate" in found["train.gradient_accumulation_steps"].message


def test_device_only_optimizers_are_refused(tmp_path):
    assert "XLA" in problems(tmp_path, {"optimizer": "adamw_torch_xla"})["train.optimizer"].message


def test_cosine_with_min_lr_needs_exactly_one_floor(tmp_path):
    p = problems(tmp_path, {"lr_scheduler": "cosine_with_min_lr"})["train.lr_scheduler"]
    assert "needs exactly one of `min_lr`, `min_lr_rate`" in p.message
    both = problems(tmp_path, {"lr_scheduler": "cosine_with_min_lr", "lr_scheduler_args": {"min_lr": 1e-6,
                                                                                         "min_lr_rate": 0.1}})
    assert "got `min_lr`, `min_lr_rate`" in both["train.lr_scheduler_args.min_lr_rate"].message


def test_scheduler_args_must_belong_to_the_scheduler(tmp_path):
    p = problems(tmp_path, {"lr_scheduler": "linear", "lr_scheduler_args": {"num_cycles": 2}})
    assert "takes no argument 'num_cycles'" in p["train.lr_scheduler_args.num_cycles"].message
    wsd = problems(tmp_path, {"lr_scheduler": "warmup_stable_decay"})
    assert "`num_decay_steps`" in wsd["train.lr_scheduler"].message


def test_polynomial_end_below_the_rate(tmp_path):
    p = problems(tmp_path, {"lr_scheduler": "polynomial", "learning_rate": 1e-4, "lr_scheduler_args": {"lr_end": 1e-3}})
    assert "must be below train.learning_rate" in p["train.lr_scheduler_args.lr_end"].message


def test_plateau_needs_eval(tmp_path):
    p = problems(tmp_path, {"lr_scheduler": "reduce_lr_on_plateau"})["train.lr_scheduler"]
    assert "eval.strategy is 'no'" in p.message


# ------------------------------------------------------------------------------ drift with transformers
def test_optimizer_names_match_transformers():
    from transformers.training_args import OptimizerNames

    assert set(OPTIMIZERS) == {o.value for o in OptimizerNames}


def test_scheduler_args_match_transformers_signatures():
    from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION

    from ftune.recipe.schema import LR_SCHEDULERS

    assert set(SCHEDULER_ARGS) == set(LR_SCHEDULERS)
    fixed = {"optimizer", "num_warmup_steps", "num_training_steps", "last_epoch"}
    for name, (accepted, required) in SCHEDULER_ARGS.items():
        fn = next(f for t, f in TYPE_TO_SCHEDULER_FUNCTION.items() if t.value == name)
        params = {p.name: p for p in inspect.signature(fn).parameters.values() if p.name not in fixed}
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            continue  # reduce_lr_on_plateau passes **kwargs to torch's ReduceLROnPlateau
        assert accepted == set(params), name
        no_default = {n for n, p in params.items() if p.default is inspect.Parameter.empty}
        assert no_default <= set().union(*required) if required else not no_default, name


# ------------------------------------------------------------------------------ validates => builds
OPTIMIZER_CHOICES = ["adamw_torch", "adamw_torch_fused", "sgd", "adagrad", "rmsprop", "adafactor", "adamw_8bit",
                     "galore_adamw", "adamw_bnb8bit", "lion_32bit"]
train_sections = st.fixed_dictionaries(
    {},
    optional={
        "max_steps": st.integers(1, 50),
        "epochs": st.sampled_from([0.5, 1, 2.5, 3]),
        "optimizer": st.sampled_from(OPTIMIZER_CHOICES),
        "optimizer_args": st.fixed_dictionaries({}, optional={
            "betas": st.sampled_from([[0.9, 0.95], [0.9], [1.5, 0.9]]), "eps": st.sampled_from([1e-8, 0, -1]),
            "target_modules": st.just(["q_proj"])}),
        "lr_scheduler": st.sampled_from(sorted(SCHEDULER_ARGS)),
        "lr_scheduler_args": st.fixed_dictionaries({}, optional={
            "min_lr": st.just(1e-6), "min_lr_rate": st.just(0.1), "num_cycles": st.just(0.5),
            "num_decay_steps": st.integers(1, 10), "lr_end": st.sampled_from([1e-7, 1.0]), "power": st.just(2.0)}),
        "warmup_ratio": st.sampled_from([0.0, 0.1, 0.5]),
        "warmup_steps": st.integers(0, 20),
        "early_stopping": st.fixed_dictionaries({"patience": st.integers(1, 3)}),
        "mixed_precision": st.sampled_from(["no", "bf16"]),
        "gradient_accumulation_steps": st.integers(1, 3),
    },
).map(lambda t: {"max_steps": None, **t})  # write() would add max_steps: 10 to an epochs-only run
eval_sections = st.fixed_dictionaries({}, optional={"strategy": st.sampled_from(["no", "steps", "epoch"]),
                                                    "steps": st.sampled_from([2, 5]),
                                                    "per_epoch": st.sampled_from([1, 2, 3, 4])})
checkpoint_sections = st.fixed_dictionaries({}, optional={"strategy": st.sampled_from(["no", "steps", "epoch"]),
                                                          "steps": st.sampled_from([4, 5, 7]),
                                                          "per_epoch": st.sampled_from([1, 2, 4]),
                                                          "load_best": st.booleans()})


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(train=train_sections, evaluation=eval_sections, checkpoint=checkpoint_sections)
def test_every_recipe_that_validates_builds_its_training_arguments(tmp_path, train, evaluation, checkpoint):
    import torch
    from transformers import Trainer, TrainingArguments, get_scheduler

    try:
        loaded = load_recipe(write(tmp_path, train, eval=evaluation, checkpoint=checkpoint))
        plan = compile_plan(loaded, check_inputs=False, gpus=0)  # this machine's packages aside (galore-torch)
    except RecipeError:
        event("refused before launch")
        return
    event("validated: built")
    args = TrainingArguments(**plan.trainer)
    if args.optim.value.startswith("galore"):
        return  # needs galore-torch, an environment check (plan/environment.py)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    optimizer = cls(model.parameters(), **kwargs)
    total = args.max_steps if args.max_steps > 0 else 24  # an epochs run: any total the data gives
    for ratio in (args.eval_steps, args.save_steps):  # below 1: the Trainer's ratio of the total steps
        assert ratio is None or ratio >= 1 or 0 < ratio < 1 and math.ceil(total * ratio) >= 1
    get_scheduler(args.lr_scheduler_type, optimizer, num_warmup_steps=args.get_warmup_steps(total),
                  num_training_steps=total, scheduler_specific_kwargs=args.lr_scheduler_kwargs)
