"""Every error is located (file:line:col, or the override), says what and how to fix, and all come at once."""

from __future__ import annotations

import pytest

from ftune.errors import RecipeError
from ftune.recipe import load_recipe

GOOD = """\
name: t
model:
  path: m
data:
  train:
    - path: d.jsonl
train:
  max_steps: 5
"""


def errors(tmp_path, text: str, overrides=(), name: str = "r.yaml"):
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(RecipeError) as err:
        load_recipe(f, overrides)
    return err.value.problems


def where(p) -> tuple:
    return (p.location.file.rsplit("/", 1)[-1] if p.location.file else p.location.origin, p.location.line, p.location.column)


def test_issue_example_text(tmp_path):
    (p,) = errors(tmp_path, GOOD + "peft:\n  method: lora\n  rnak: 8\n")
    assert p.render().endswith(
        "r.yaml:11:3: error: peft.rnak: unknown key (did you mean 'r'?)\n"
        "    hint: allowed keys under `peft`: method, r, alpha, dropout, target_modules, target_parameters, experts, "
        "router, modules_to_save, modules, bias, use_rslora, use_dora, init"
    )


def test_every_problem_at_once_in_file_order(tmp_path):
    text = GOOD.replace("path: m", "path: m\n  dtype: bf16") + "train:\n  lerning_rate: 1\n" + "eval: {strategy: sometimes}\n"
    text = text.replace("train:\n  max_steps: 5\n", "")
    found = errors(tmp_path, text)
    assert [(p.path, where(p)[1]) for p in found] == [
        ("model.dtype", 4),
        ("train", 8),  # a rule (neither epochs nor max_steps) beside the schema errors
        ("train.lerning_rate", 9),
        ("eval.strategy", 10),
    ]
    assert "did you mean 'bfloat16'?" in found[0].message
    assert found[0].hint == "allowed values: float32, bfloat16, float16, auto"
    assert "did you mean 'learning_rate'?" in found[2].message


def test_wrong_type_points_at_value_with_quote_hint(tmp_path):
    (p,) = errors(tmp_path, GOOD.replace("max_steps: 5", "max_steps: five"))
    assert (p.path, p.message, where(p)) == ("train.max_steps", "expected an integer, got 'five'", ("r.yaml", 8, 14))
    assert "Optimizer steps" in p.hint


def test_number_out_of_range_gives_range(tmp_path):
    (p,) = errors(tmp_path, GOOD + "peft: {dropout: 1.5}\n")
    assert (p.path, p.message, p.hint) == ("peft.dropout", "1.5 is out of range", "allowed range: 0.0 <= dropout < 1.0")


def test_missing_key_located_at_parent(tmp_path):
    (p,) = errors(tmp_path, GOOD.replace("  path: m\n", "  dtype: auto\n"))
    assert (p.path, p.message, where(p)) == ("model.path", "required key is missing", ("r.yaml", 2, 1))


def test_missing_section_located_at_top(tmp_path):
    (p,) = errors(tmp_path, GOOD.replace("model:\n  path: m\n", ""))
    assert (p.path, where(p)) == ("model", ("r.yaml", 1, 1))


def test_unknown_method_did_you_mean(tmp_path):
    (p,) = errors(tmp_path, GOOD + "peft:\n  method: lroa\n")
    assert (p.path, where(p)) == ("peft.method", ("r.yaml", 10, 11))
    assert "did you mean 'lora'?" in p.message and "llama-adapter" in p.hint


def test_key_of_another_method(tmp_path):
    (p,) = errors(tmp_path, GOOD + "peft:\n  method: prefix\n  r: 8\n")
    assert p.path == "peft.r" and "belongs to peft.method lora" in p.hint


def test_union_value_one_message(tmp_path):
    (p,) = errors(tmp_path, GOOD + "distributed: {num_processes: many}\n")
    assert p.message == "expected an integer or 'auto', got 'many'"


def test_bad_list_item_in_union_reports_the_item(tmp_path):
    missing, unknown = errors(tmp_path, GOOD.replace("data:\n", "data:\n  eval:\n    - pth: e.jsonl\n"))
    assert (missing.path, missing.message, where(missing)[1:]) == ("data.eval[0].path", "required key is missing", (6, 7))
    assert (unknown.path, where(unknown)[1:]) == ("data.eval[0].pth", (6, 7))
    assert "did you mean 'path'?" in unknown.message


def test_broken_indentation(tmp_path):
    (p,) = errors(tmp_path, GOOD.replace("  path: m", "  path: m\n dtype: auto"))
    assert where(p)[:2] == ("r.yaml", 4) and "YAML syntax error" in p.message and "indentation" in p.hint


def test_tab_indentation(tmp_path):
    (p,) = errors(tmp_path, GOOD.replace("  path: m", "\tpath: m"))
    assert where(p)[:2] == ("r.yaml", 3) and "tabs" in p.hint


def test_duplicate_key(tmp_path):
    (p,) = errors(tmp_path, GOOD + "train:\n  max_steps: 6\n")
    assert (p.path, where(p)) == ("train", ("r.yaml", 9, 1))
    assert p.message == "duplicate key 'train' (first at line 7)"


def test_python_tag_refused(tmp_path):
    (p,) = errors(tmp_path, GOOD + "description: !!python/object/apply:os.system ['echo pwned']\n")
    assert (p.path, where(p)) == ("description", ("r.yaml", 9, 14))
    assert "'!!python/object/apply:os.system' is not allowed" in p.message


def test_custom_tag_refused(tmp_path):
    (p,) = errors(tmp_path, GOOD + "description: !include other.yaml\n")
    assert "'!include' is not allowed" in p.message


def test_alias_bomb_refused_fast(tmp_path, monkeypatch):
    """10^10 values through aliases: refused after at most MAX_NODES of them (counted, not timed)."""
    from ftune.recipe import _yaml

    lines = ['a: &a ["x","x","x","x","x","x","x","x","x","x"]']
    for i in range(1, 10):
        prev, cur = chr(96 + i), chr(97 + i)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 10) + "]")
    visited = []
    real = _yaml._Walker.value

    def counting(self, node, path):
        visited.append(1)
        return real(self, node, path)

    monkeypatch.setattr(_yaml._Walker, "value", counting)
    (p,) = errors(tmp_path, GOOD + "\n".join(lines) + "\n")
    assert len(visited) <= _yaml.MAX_NODES + 1
    assert "alias bomb" in p.message and where(p)[0] == "r.yaml"


def test_recursive_alias(tmp_path):
    found = errors(tmp_path, GOOD + "description: &d [*d]\n")
    assert any("recursive YAML alias" in p.message for p in found)


def test_not_a_mapping(tmp_path):
    (p,) = errors(tmp_path, "- just\n- a list\n")
    assert "mapping of sections" in p.message and where(p) == ("r.yaml", 1, 1)


def test_empty_file_lists_required_sections(tmp_path):
    assert {p.path for p in errors(tmp_path, "")} == {"name", "model", "data"}


# ------------------------------------------------------------------------ through extends
def test_error_in_base_points_into_base(tmp_path):
    (tmp_path / "base.yaml").write_text("model:\n  path: m\n  dtyp: bfloat16\n")
    (p,) = errors(tmp_path, "name: t\nextends: base.yaml\ndata: {train: [{path: d}]}\ntrain: {epochs: 1}\n")
    assert (p.path, where(p)) == ("model.dtyp", ("base.yaml", 3, 3))


def test_syntax_error_in_base_points_into_base(tmp_path):
    (tmp_path / "base.yaml").write_text("model:\n  path: [m\n")
    found = errors(tmp_path, "name: t\nextends: base.yaml\ndata: {train: [{path: d}]}\ntrain: {epochs: 1}\n")
    assert where(found[0])[0] == "base.yaml" and "YAML syntax error" in found[0].message


def test_missing_base_located_at_extends_entry(tmp_path):
    (tmp_path / "bases").mkdir()
    (tmp_path / "bases" / "llama2-7b.yaml").write_text("model: {path: m}\n")
    found = errors(tmp_path, "name: t\nextends:\n  - bases/llama2-7b.yaml\n  - bases/llama-7b.yaml\n")
    p = next(p for p in found if p.path == "extends")
    assert where(p) == ("r.yaml", 4, 5)
    assert p.message.startswith("base recipe not found: bases/llama-7b.yaml")
    assert p.hint == "did you mean 'llama2-7b.yaml'?"


def test_extends_cycle_located(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\nmodel: {path: m}\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    found = errors(tmp_path, "name: t\nextends: a.yaml\ndata: {train: [{path: d}]}\ntrain: {epochs: 1}\n")
    (p,) = [p for p in found if "cycle" in p.message]
    assert where(p) == ("b.yaml", 1, 10)
    assert "a.yaml → b.yaml → a.yaml" in p.message


def test_self_extends(tmp_path):
    (p,) = errors(tmp_path, GOOD + "extends: r.yaml\n")
    assert "extends cycle" in p.message and where(p) == ("r.yaml", 9, 10)


def test_rule_violation_from_base_points_into_base(tmp_path):
    (tmp_path / "base.yaml").write_text("train:\n  warmup_ratio: 0.1\n  warmup_steps: 3\n")
    (p,) = errors(tmp_path, GOOD + "extends: base.yaml\n")
    assert (p.path, where(p)) == ("train.warmup_steps", ("base.yaml", 3, 3))


# ------------------------------------------------------------------------ interpolation
def test_unknown_reference(tmp_path):
    (p,) = errors(tmp_path, GOOD + "output: {dir: 'runs/${nmae}'}\n")
    assert (p.path, where(p)) == ("output.dir", ("r.yaml", 9, 15))
    assert "unknown reference '${nmae}' (did you mean '${name}'?)" == p.message


def test_unset_env_without_default(tmp_path, monkeypatch):
    monkeypatch.delenv("FT_NOPE", raising=False)
    (p,) = errors(tmp_path, GOOD.replace("path: m", "path: ${env:FT_NOPE}"))
    assert p.path == "model.path" and "environment variable FT_NOPE is not set" in p.message
    assert "${env:FT_NOPE,default}" in p.hint and where(p)[1] == 3


def test_bad_interpolation_syntax_does_not_hide_others(tmp_path):
    found = errors(tmp_path, GOOD + "description: '${oops'\noutput: {dir: '${nope}'}\n")
    assert [p.path for p in found] == ["description", "output.dir"]


# ------------------------------------------------------------------------ overrides
def test_override_unknown_key_quotes_the_argument(tmp_path):
    (p,) = errors(tmp_path, GOOD, ["train.learning_rte=1e-3"])
    assert p.render().startswith(
        "<override>: error: train.learning_rte: unknown key (did you mean 'learning_rate'?) (override 'train.learning_rte=1e-3')"
    )


def test_override_peft_keys_follow_the_method(tmp_path):
    (p,) = errors(tmp_path, GOOD, ["peft.method=prefix", "peft.r=4"])
    assert p.path == "peft.r" and "belongs to peft.method lora" in p.hint
    found = errors(tmp_path, GOOD, ["peft.num_virtual_tokens=4"])
    assert found[0].path == "peft.num_virtual_tokens"


def test_override_wrong_type_quotes_argument(tmp_path):
    (p,) = errors(tmp_path, GOOD, ["train.max_steps=lots"])
    assert p.message == "expected an integer, got 'lots' (override 'train.max_steps=lots')"
    assert p.location.origin == "override"


def test_override_rule_violation_located_at_override(tmp_path):
    (p,) = errors(tmp_path, GOOD, ["peft.r=0"])
    assert p.path == "peft.r" and p.message.endswith("(override 'peft.r=0')")


def test_override_list_index_out_of_range(tmp_path):
    (p,) = errors(tmp_path, GOOD, ["data.train.3.path=x"])
    assert "index 3 is out of range" in p.message


def test_override_takes_the_key_as_errors_spell_it(tmp_path):
    """`data.train[0].path`, copied from an error, is `data.train.0.path`: same recipe, same error."""
    for key in ("data.train[3].path", "data.train.3.path"):
        (p,) = errors(tmp_path, GOOD, [f"{key}=x"])
        assert "index 3 is out of range" in p.message and p.path == "data.train[3]"
    from ftune.recipe._overrides import parse_overrides

    assert parse_overrides(["data.train[0].path=x"])[0].parts == ("data", "train", 0, "path")


def test_a_non_ascii_digit_is_a_key_not_an_index(tmp_path):
    """'²'.isdigit() is True but int('²') raises: found by the fuzzer (a ValueError traceback, not a report)."""
    (p,) = errors(tmp_path, GOOD, ["data.train.²=1"])
    assert p.path.startswith("data.train") and "not a list" not in p.message
    (p,) = errors(tmp_path, GOOD, ["data.²=1"])
    assert "unknown key" in p.message


def test_override_python_tag_refused(tmp_path):
    (p,) = errors(tmp_path, GOOD, ["description=!!python/name:os.system"])
    assert "not allowed" in p.message


def test_control_character_located(tmp_path):
    (p,) = errors(tmp_path, GOOD.replace("path: m", "path: m\x1b"))
    assert where(p) == ("r.yaml", 3, 10) and "#x001b" in p.message


def test_control_character_in_override_value_is_text(tmp_path):
    (p,) = errors(tmp_path, GOOD, ["train.max_steps=\x1b"])
    assert p.path == "train.max_steps" and p.location.origin == "override"


def test_constraint_inside_a_union_wins_over_other_alternatives(tmp_path):
    (p,) = errors(tmp_path, GOOD + "distributed: {num_processes: 0}\n")
    assert (p.path, p.message, p.hint) == ("distributed.num_processes", "0 is out of range", "allowed range: num_processes >= 1")


def test_empty_list(tmp_path):
    (p,) = errors(tmp_path, GOOD.replace("  train:\n    - path: d.jsonl\n", "  train: []\n"))
    assert (p.path, p.message) == ("data.train", "needs at least 1 item, got 0")


def test_bad_extends_value_reported_once(tmp_path):
    (p,) = errors(tmp_path, GOOD + "extends: 5\n")
    assert (p.path, p.message) == ("extends", "expected a path or a list of paths")


def test_yaml_boolean_in_an_enum_says_to_quote_it(tmp_path):
    found = errors(tmp_path, GOOD.replace("max_steps: 5", "max_steps: 5\n  mixed_precision: no\n  lr_scheduler: on")
                   + "eval: {strategy: Off}\n")
    assert [(p.path, where(p)[1:], p.message, p.hint) for p in found] == [
        ("train.mixed_precision", (9, 20), "invalid value false: an unquoted no, off or false is read as the boolean "
         "false", "quote it: 'no', in an override too: \"train.mixed_precision='no'\" (allowed values: no, fp16, bf16)"),
        ("train.lr_scheduler", (10, 17), "invalid value true: an unquoted yes, on or true is read as the boolean true",
         found[1].hint),
        ("eval.strategy", (11, 18), "invalid value false: an unquoted no, off or false is read as the boolean false",
         "quote it: 'no', in an override too: \"eval.strategy='no'\" (allowed values: no, steps, epoch)"),
    ]
    assert found[1].hint.startswith("allowed values: linear, cosine")  # no allowed value YAML reads as true


def test_yaml_boolean_in_a_string_or_union_says_so(tmp_path):
    found = errors(tmp_path, GOOD.replace("name: t", "name: yes") + "peft: {method: lora, target_modules: on}\n")
    assert [(p.path, p.message, p.hint) for p in found] == [
        ("name", "expected a string, got true: an unquoted yes, on or true is read as the boolean true",
         "quote it, e.g. 'yes'"),
        ("peft.target_modules", "expected a list or 'all-linear', got true: an unquoted yes, on or true is read as "
         "the boolean true", found[1].hint),
    ]
    assert found[1].hint.startswith("target_modules: ")  # quoting `on` would not help: no quote hint


def test_yaml_boolean_in_an_override_says_to_quote_it(tmp_path):
    (p,) = errors(tmp_path, GOOD, ["train.mixed_precision=off"])
    assert (p.path, where(p), p.hint) == ("train.mixed_precision", ("override", None, None),
                                          "quote it: 'no', in an override too: \"train.mixed_precision='no'\" "
                                          "(allowed values: no, fp16, bf16)")


@pytest.mark.parametrize("yaml_value, shown", [(".inf", "inf"), ("-.inf", "-inf"), (".nan", "nan"), ("1e999", "'1e999'")])
def test_non_finite_numbers_refused_where_the_schema_takes_numbers(tmp_path, yaml_value, shown):
    text = GOOD + f"  learning_rate: {yaml_value}\n  max_grad_norm: {yaml_value}\npeft: {{dropout: {yaml_value}}}\n"
    found = errors(tmp_path, text)
    assert [(p.path, p.message, where(p)) for p in found] == [
        ("train.learning_rate", f"{shown} is not a finite number", ("r.yaml", 9, 18)),
        ("train.max_grad_norm", f"{shown} is not a finite number", ("r.yaml", 10, 18)),
        ("peft.dropout", f"{shown} is not a finite number", ("r.yaml", 11, 17)),
    ]
    assert found[0].hint == "allowed range: learning_rate > 0"


def test_non_finite_override_is_refused(tmp_path):
    (p,) = errors(tmp_path, GOOD, ["data.eval={split: .nan}"])
    assert (p.path, p.message, where(p)) == ("data.eval.split", "nan is not a finite number (override 'data.eval={split: .nan}')",
                                            ("override", None, None))


def test_deeply_nested_interpolation_is_located_not_a_crash(tmp_path):
    (p,) = errors(tmp_path, GOOD + 'description: "' + "${env:A," * 3000 + "x" + "}" * 3000 + '"\n')
    assert (p.path, p.message, where(p)) == ("description", "interpolations nested deeper than 8 levels", ("r.yaml", 9, 14))
