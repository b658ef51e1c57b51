"""`ftune plan`, `ftune run --dry-run` and `ftune run` refuse the same recipes (the compiler runs every pre-launch
check): each refusal is located in the recipe, exits 1, and `run` creates no run dir."""

from __future__ import annotations

import json

import pytest
import yaml

from ftune.cli.main import main

CASES = {
    # the fault, the key the error names, words of its message, and what starts the line it points at
    "fsdp-wrap-class": ({"distributed": {"strategy": "fsdp", "num_processes": 2,
                                          "fsdp": {"transformer_layer_cls": ["GPT2Block"]}}},
                        "distributed.fsdp.transformer_layer_cls", "GPT2Block not found in LlamaForCausalLM",
                        "transformer_layer_cls:"),
    "positions": ({"data": {"max_seq_length": 4096}}, "data.max_seq_length",
                  "longer than the model's max_position_embeddings (512", "max_seq_length:"),
    "missing-column": ({"data": {"format": "instruction"}}, "data.train[0].fields.instruction",
                       "instruction data needs field `instruction`", "- path:"),  # the source entry
    "targets": ({"peft": {"method": "lora", "r": 4, "target_modules": ["nope_proj"]}}, "peft.target_modules",
                "matches no module of the model", "target_modules:"),
}


def _write(tmp_path, tiny_model_dir, text_data_file, case: dict) -> tuple:
    data = {"train": [{"path": str(text_data_file), **({"format": case["data"]["format"]} if "format" in
                                                         case.get("data", {}) else {})}]}
    data |= {k: v for k, v in case.get("data", {}).items() if k != "format"}
    recipe = {"name": "refused", "model": {"path": str(tiny_model_dir)}, "data": data,
              "peft": case.get("peft", {"method": "lora", "r": 4, "target_modules": ["q_proj"]}),
              "train": {"max_steps": 1}, "output": {"dir": str(tmp_path / "runs" / "refused")}}
    if "distributed" in case:
        recipe["distributed"] = case["distributed"]
    path = tmp_path / "recipe.yaml"
    text = yaml.safe_dump(recipe, sort_keys=False)
    path.write_text(text)
    return path, text


def _line_of(text: str, start: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.strip().startswith(start))


@pytest.mark.parametrize("name", CASES)
def test_plan_and_run_refuse_alike_before_writing_anything(name, tmp_path, tiny_model_dir, text_data_file, capsys):
    case, key, words, start = CASES[name]
    path, text = _write(tmp_path, tiny_model_dir, text_data_file, case)
    line = _line_of(text, start)
    for command in (["plan", str(path)], ["run", str(path), "--dry-run"], ["run", str(path)]):
        code = main(command)
        err = capsys.readouterr().err
        assert code == 1, (command, err)
        assert f"{path}:{line}:" in err and f"error: {key}: " in err and words in err, (command, err)
    assert not (tmp_path / "runs").exists()  # refused before the run dir was created or locked
    code = main(["plan", str(path), "--format", "json"])
    errors = json.loads(capsys.readouterr().out)["errors"]
    assert code == 1 and (key, line) in [(e["path"], e["line"]) for e in errors]


def test_validate_check_paths_refuses_the_missing_column_too(tmp_path, tiny_model_dir, text_data_file, capsys):
    path, text = _write(tmp_path, tiny_model_dir, text_data_file, CASES["missing-column"][0])
    assert main(["validate", str(path), "--check-paths", "--format", "json"]) == 1
    errors = json.loads(capsys.readouterr().out)["files"][0]["errors"]
    assert [e["path"] for e in errors] == ["data.train[0].fields.instruction", "data.train[0].fields.output"]
    assert {e["line"] for e in errors} == {_line_of(text, "- path:")}


def test_a_recipe_the_checks_pass_plans(tmp_path, tiny_model_dir, text_data_file, capsys):
    """The negative control: the same recipe without the fault plans and dry-runs."""
    path, _ = _write(tmp_path, tiny_model_dir, text_data_file, {})
    assert main(["plan", str(path)]) == 0
    assert main(["run", str(path), "--dry-run"]) == 0
    assert "GPT2Block" not in capsys.readouterr().err


def test_a_missing_data_file_has_one_wording(tmp_path, tiny_model_dir, text_data_file, capsys):
    """`plan` runs without the inputs (it names what is missing and exits 0); `validate --check-paths` and `run`
    refuse it: all three in the compiler's words (`ftune.plan.checks.paths`), and `run` before it writes anything."""
    path, text = _write(tmp_path, tiny_model_dir, text_data_file, {})
    path.write_text(text.replace(str(text_data_file), "missing.jsonl"))
    # without the data, plan can't find the longest row: data.max_seq_length is asked for, located
    assert main(["plan", str(path)]) == 1
    assert f"{path}:4:1: error: data.max_seq_length: unset, and the plan can't find the longest row (a data source " \
           "is not a local file)" in capsys.readouterr().err
    path, text = _write(tmp_path, tiny_model_dir, text_data_file, {"data": {"max_seq_length": 32}})
    path.write_text(text.replace(str(text_data_file), "missing.jsonl"))
    words = "data.train[0].path: data file not found: missing.jsonl"
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "not counted (data file not found: missing.jsonl)" in out and f"missing: {words}" in out
    assert main(["plan", str(path), "--format", "json"]) == 0
    [missing] = json.loads(capsys.readouterr().out)["missing"]
    assert (missing["path"], missing["message"]) == ("data.train[0].path", "data file not found: missing.jsonl")
    assert main(["validate", str(path), "--check-paths"]) == 1
    assert f"error: {words}" in capsys.readouterr().out  # validate reports on stdout
    assert main(["run", str(path)]) == 1
    assert f"error: {words}" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
