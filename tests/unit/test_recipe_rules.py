"""One test per core cross-field rule: the violation is reported, located at the key to change."""

from __future__ import annotations

import textwrap

import pytest

from ftune.errors import RecipeError
from ftune.recipe import load_recipe, rules
from ftune.errors import Problem
from ftune.recipe.schema import Recipe

BASE = """\
name: t
model:
  path: m
data:
  train:
    - path: d.jsonl
train:
  max_steps: 5
"""


def problems(tmp_path, text: str):
    f = tmp_path / "r.yaml"
    f.write_text(text)
    with pytest.raises(RecipeError) as err:
        load_recipe(f)
    return err.value.problems


def recipe(after: dict[str, str] | None = None, tail: str = "") -> str:
    """BASE with lines inserted after given lines (by their text), and `tail` appended."""
    lines = BASE.splitlines(keepends=True)
    out = []
    for line in lines:
        out.append(line)
        if after and line.rstrip("\n") in after:
            out.append(after[line.rstrip("\n")])
    return "".join(out) + tail


CLS = {"  path: m": "  task: sequence-classification\n  labels: [a, b]\n"}
CASES = [
    # (id, recipe text, path, message fragment, line, column)
    ("fsdp-without-fsdp", recipe(tail="distributed:\n  strategy: ddp\n  fsdp: {cpu_offload: true}\n"),
     "distributed.fsdp", "strategy is 'ddp'", 11, 3),
    ("deepspeed-without-deepspeed", recipe(tail="distributed:\n  deepspeed: {stage: 3}\n"),
     "distributed.deepspeed", "strategy is 'none'", 10, 3),
    ("packing-without-length", recipe({"data:": "  packing: true\n"}), "data.packing", "max_seq_length", 5, 3),
    ("packing-classification", recipe(CLS | {"data:": "  packing: true\n  max_seq_length: 64\n"}),
     "data.packing", "classification row must hold exactly one sample", 7, 3),
    ("packing-prefix", recipe({"data:": "  packing: true\n  max_seq_length: 64\n"}, "peft:\n  method: prefix\n"),
     "data.packing", "prefix tuning", 5, 3),
    ("eval-on-start-without-data", recipe(tail="eval:\n  on_start: true\n"), "eval.on_start", "needs eval data",
     10, 3),
    ("eval-without-data", recipe(tail="eval:\n  strategy: epoch\n"), "eval.strategy", "no eval data", 10, 3),
    ("eval-steps-without-steps", recipe({"data:": "  eval: {split: 0.1}\n"}, "eval:\n  strategy: steps\n"),
     "eval.steps", "`eval.steps` is not set", 10, 1),
    ("both-warmups", recipe(tail="  warmup_ratio: 0.1\n  warmup_steps: 10\n"),
     "train.warmup_steps", "can't set both", 10, 3),
    ("lora-rank-zero", recipe(tail="peft:\n  method: lora\n  r: 0\n"), "peft.r", "rank must be > 0, got 0", 11, 3),
    ("lora-rank-negative", recipe(tail="peft:\n  r: -4\n"), "peft.r", "got -4", 10, 3),
    ("schema-version", recipe(tail="schema_version: 2\n"), "schema_version", "unsupported schema_version 2", 9, 1),
    ("early-stopping-without-eval", recipe(tail="  early_stopping: {patience: 2}\n"),
     "train.early_stopping", "needs evaluation", 9, 3),
    ("load-best-without-eval", recipe(tail="checkpoint:\n  load_best: true\n"),
     "checkpoint.load_best", "eval.strategy is 'no'", 10, 3),
    ("load-best-strategy-mismatch",
     recipe({"data:": "  eval: {split: 0.1}\n"}, "eval: {strategy: epoch}\ncheckpoint: {strategy: steps, load_best: true}\n"),
     "checkpoint.strategy", "checkpoint.strategy is 'steps'", 11, 14),
    # early stopping loads the best checkpoint at the end: the Trainer refuses these after launch
    ("early-stopping-save-per-epoch",
     recipe({"data:": "  eval: {split: 0.1}\n"},
            "  early_stopping: {patience: 2}\neval: {strategy: steps, steps: 5}\ncheckpoint: {strategy: epoch}\n"),
     "checkpoint.strategy", "train.early_stopping needs a checkpoint saved at every evaluation", 12, 14),
    ("early-stopping-save-not-multiple",
     recipe({"data:": "  eval: {split: 0.1}\n"},
            "  early_stopping: {patience: 2}\neval: {strategy: steps, steps: 5}\ncheckpoint: {steps: 12}\n"),
     "checkpoint.steps", "checkpoint.steps (12) to be a multiple of eval.steps (5)", 12, 14),
    ("classification-with-causal-lm", recipe({"    - path: d.jsonl": "      format: classification\n"}),
     "data.train[0].format", "needs model.task 'sequence-classification'", 7, 7),
    ("causal-format-with-classification", recipe(CLS), "data.train[0].format", "has format 'text'", 8, 7),
    ("num-labels-mismatch", recipe({"  path: m": "  num_labels: 3\n  labels: [a, b]\n"}),
     "model.num_labels", "num_labels is 3 but model.labels names 2", 4, 3),
    ("quantized-full", recipe(tail="peft: {method: full}\nquantization: {bits: 4}\n"),
     "quantization.bits", "method 'full'", 10, 16),
    ("interleave-one-source", recipe({"data:": "  mix: interleave\n"}), "data.mix", "data.train has one", 5, 3),
    ("mix-stopping-without-interleave", recipe({"data:": "  mix_stopping: all_exhausted\n"}),
     "data.mix_stopping", "applies to `data.mix: interleave` only", 5, 3),
    ("quantized-freeze", recipe(tail="peft: {method: freeze, trainable: [lm_head]}\nquantization: {bits: 8}\n"),
     "quantization.bits", "method 'freeze'", 10, 16),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_rule_reported_and_located(tmp_path, case):
    _, text, path, fragment, line, column = case
    everything = problems(tmp_path, text)
    found = [p for p in everything if p.path == path]
    assert len(found) == 1, [p.render() for p in everything]
    p = found[0]
    assert fragment in p.message
    assert p.hint
    assert (p.location.file.endswith("r.yaml"), p.location.line, p.location.column) == (True, line, column)


def test_training_length_needed(tmp_path):
    (p,) = problems(tmp_path, BASE.replace("train:\n  max_steps: 5\n", ""))
    assert p.path == "train"
    assert "neither `train.epochs` nor `train.max_steps`" in p.message
    assert (p.location.line, p.location.column) == (1, 1)  # no train section: the top of the file


def test_classification_needs_labels(tmp_path):
    text = recipe({"  path: m": "  task: sequence-classification\n", "    - path: d.jsonl": "      format: classification\n"})
    (p,) = problems(tmp_path, text)
    assert p.path == "model.task" and "model.labels" in p.message and p.location.line == 4


def test_rules_and_schema_errors_reported_together(tmp_path):
    found = problems(tmp_path, recipe(tail="  warmup_ratio: 0.1\n  warmup_steps: 10\n  lr_schedular: cosine\n"))
    assert [p.path for p in found] == ["train.warmup_steps", "train.lr_schedular"]
    assert "did you mean 'lr_scheduler'?" in found[1].message


def test_rule_on_an_invalid_key_is_not_doubled(tmp_path):
    found = problems(tmp_path, BASE.replace("  max_steps: 5\n", "  epochs: -1\n"))
    assert [(p.path, p.message) for p in found] == [("train.epochs", "-1 is out of range")]
    assert found[0].hint == "allowed range: epochs > 0"


def test_valid_recipe_has_no_violations(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text(BASE)
    assert rules.check(load_recipe(f).recipe) == []


def test_every_rule_module_registers_rules():
    assert len(rules.all_rules()) >= 14
    assert all(callable(r) for r in rules.all_rules())


def test_check_runs_on_a_typed_recipe():
    recipe = Recipe.model_validate(
        {"name": "t", "model": {"path": "m"}, "data": {"train": [{"path": "d"}], "packing": True}, "train": {"epochs": 1}}
    )
    assert Problem.at(
        "data.packing",
        "packing needs `data.max_seq_length` (the length rows are packed to)",
        "set `data.max_seq_length`, e.g. 2048, or `data.packing: false`",
    ) in rules.check(recipe)


@pytest.mark.parametrize("value", ["[]", "{}", "3"])
def test_a_format_of_the_wrong_type_is_located_not_a_crash(tmp_path, value):
    """The alias expansion (sharegpt, alpaca) reads `format` before validation: a list or mapping there is reported
    at its key like any wrong value (it raised TypeError: unhashable type)."""
    found = problems(tmp_path, recipe({"    - path: d.jsonl": f"      format: {value}\n"}))
    assert [p.location.line for p in found if "format" in p.path] == [7], [p.render() for p in found]


@pytest.mark.parametrize(("change", "where", "says"), [
    ({"train:\n  max_steps: 5\n": "train:\n  epochs: 1\n"}, "data.streaming", "needs train.max_steps"),
    ({"    - path: d.jsonl\n": "    - path: d.jsonl\n  eval:\n    split: 0.1\n"}, "data.eval.split",
     "can't hold out a fraction"),
    ({"    - path: d.jsonl\n": "    - path: d.jsonl\n  eval:\n    - path: e.jsonl\n"}, "data.eval[0]",
     "a streamed eval source needs a bound"),
    ({"    - path: d.jsonl\n": "    - path: d.jsonl\n  eval:\n    - path: e.jsonl\n      limit: 9\n      split: "
      "train[:5]\n"}, "data.eval[0].split", "split slices need its rows counted"),
])
def test_streaming_refuses_what_a_stream_cannot_do(tmp_path, change, where, says):
    text = BASE.replace("data:\n", "data:\n  streaming: true\n")
    for old, new in change.items():
        text = text.replace(old, new)
    found = problems(tmp_path, text)
    assert [p.path for p in found] == [where] and says in found[0].message, [(p.path, p.message) for p in found]
    assert found[0].hint and found[0].location.file.endswith("r.yaml") and found[0].location.line > 1
