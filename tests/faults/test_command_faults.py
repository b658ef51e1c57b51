"""The internal errors and misleading messages of the fault exploration (issue 22), one test each: every one is now
a located error with a hint and a documented exit code, never a traceback or "internal error"."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ftune.cli.main import main
from ftune.errors import FtuneError
from tests.faults._runs import finished_lora_run

LF = Path(__file__).resolve().parents[1] / "data" / "import" / "llama-factory"


def _clean(text: str) -> str:
    assert "Traceback" not in text and "internal error" not in text, text
    return text


@pytest.fixture
def lora_run(tmp_path):
    """A finished LoRA run dir (plan.json, final/ with its adapter config), no weights: nothing here is loaded."""
    (tmp_path / "model").mkdir()
    return finished_lora_run(tmp_path, tmp_path / "model", {"peft_type": "LORA", "r": 8, "lora_alpha": 16})


# ------------------------------------------------------------------------------------------------ merge
@pytest.mark.parametrize(("config", "says"), [
    ('{"peft_type": "LORA", "r": ', "is not valid JSON"),
    ('{"peft_type": "LORA", "r": "8"}', "`r` is '8', expected an integer"),
    ('{"peft_type": "LORA", "target_modules": {"q": 1}}', "`target_modules` is {'q': 1}, expected a list or a string"),
    ("[1, 2]", "is not a JSON object"),
])
def test_merge_refuses_a_cut_short_or_wrong_typed_adapter_config(lora_run, capsys, config, says):
    (lora_run.final / "adapter_config.json").write_text(config)
    assert main(["merge", str(lora_run.root)]) == 1
    err = _clean(capsys.readouterr().err)
    assert f"{lora_run.final / 'adapter_config.json'}" in err and says in err and "copy it again" in err


def test_merge_shard_size_needs_a_unit_and_is_read_before_anything_loads(tmp_path, capsys):
    # the target does not even exist: the size is read first, so a typo costs no model load
    assert main(["merge", str(tmp_path / "nowhere"), "--shard-size", "5XB"]) == 1
    assert "cannot read --shard-size '5XB'" in _clean(capsys.readouterr().err)
    assert main(["merge", str(tmp_path / "nowhere"), "--shard-size", "500"]) == 1
    assert "--shard-size '500' has no unit" in capsys.readouterr().err


def test_merge_on_a_full_disk_is_an_io_error_and_leaves_nothing(lora_run, monkeypatch):
    from ftune.infer import merge as m
    from ftune.infer.source import resolve

    def full_disk(target, plan, action, dtype, shard_size, out, tmp, log, quantize):
        tmp.mkdir()
        (tmp / "model.safetensors").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "model.safetensors"))

    monkeypatch.setattr(m, "_write_verified", full_disk)
    with pytest.raises(FtuneError) as info:
        m.merge(resolve(str(lora_run.root)))
    assert info.value.exit_code == 2 and "no space left on the device holding" in info.value.message
    assert sorted(p.name for p in lora_run.root.iterdir()) == ["final", "ftune_run.json", "plan.json"]  # no partial


def test_merge_to_a_base_that_moved_names_it(lora_run, capsys):
    (lora_run.root.parent.parent / "model").rmdir()
    assert main(["merge", str(lora_run.root)]) == 1
    err = _clean(capsys.readouterr().err)
    assert "goes on the base model" in err and "no longer there (moved or deleted)" in err and "Repo id" not in err


# ------------------------------------------------------------------------------------------------ import
def test_llama_factory_import_with_wrong_types_lists_them_as_not_imported(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "dataset_info.json").write_text(json.dumps(
        {"a": 5, "b": {"file_name": "b.json", "columns": [1, 2]}, "c": {"file_name": "c.json", "tags": 3}}))
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model_name_or_path: m\nstage: sft\ndataset: a,b,c\nmax_samples: [1]\n")
    assert main(["import", "llama-factory", str(cfg), "-o", str(tmp_path / "r.yaml")]) == 1  # data: nothing left
    err = _clean(capsys.readouterr().err)
    assert "'a': its dataset_info.json entry is int, not an object" in err
    assert "'b': its 'columns' in dataset_info.json must map names" in err and "'c': its 'tags'" in err
    assert "max_samples must be a whole number, got [1]" in err
    cfg.write_text("model_name_or_path: m\ndataset: [1, {x: 2}]\n")
    assert main(["import", "llama-factory", str(cfg), "-o", str(tmp_path / "r2.yaml")]) == 1
    assert "dataset: 1 is not a dataset name" in _clean(capsys.readouterr().err)


def test_a_malformed_dataset_info_is_a_located_error_not_ignored(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "dataset_info.json").write_text('{"a": {"file_name": "a.json",}}')
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model_name_or_path: m\ndataset: a\n")
    assert main(["import", "llama-factory", str(cfg)]) == 1
    err = _clean(capsys.readouterr().err)
    assert f"{tmp_path / 'data' / 'dataset_info.json'}:1:" in err and "is not valid JSON" in err


def test_import_to_a_full_stdout_is_an_io_error(tmp_path):
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "ftune.cli.main", "import", "axolotl",
                               str(LF.parent / "axolotl" / "qlora.yml")], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "can't write to standard output: No space left on device" in proc.stderr
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr


# ------------------------------------------------------------------------------------------------ plan
@pytest.mark.parametrize(("value", "says"), [("80", "--gpu-memory '80' has no unit"),
                                             ("0", "--gpu-memory '0' has no unit"),
                                             ("0GiB", "--gpu-memory '0GiB' must be more than 0 bytes"),
                                             ("lots", "cannot read --gpu-memory 'lots'")])
def test_plan_gpu_memory_needs_a_unit_and_a_positive_size(tmp_path, capsys, value, says):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: x\nmodel: {path: m}\ndata: {train: [{path: d.jsonl}]}\n")
    assert main(["plan", str(recipe), "--gpu-memory", value]) == 1
    err = _clean(capsys.readouterr().err)
    assert says in err and "GiB" in err


# ------------------------------------------------------------------------------------------------ generate, chat
def test_generate_batch_size_zero_is_a_usage_error(tmp_path, capsys):
    assert main(["generate", str(tmp_path), "--prompt", "hi", "--batch-size", "0"]) == 2
    assert "--batch-size must be at least 1, got 0" in _clean(capsys.readouterr().err)


def test_generate_on_a_folder_without_a_tokenizer_names_it(tmp_path, tiny_model_dir, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    assert main(["generate", str(bare), "--prompt", "hi"]) == 1
    err = _clean(capsys.readouterr().err)
    assert f"{bare} holds no tokenizer ftune can load" in err and "tokenizer.json" in err


@pytest.fixture(scope="module")
def short_model(tiny_tokenizer_dir, tmp_path_factory):
    """A tiny Llama with 48 positions: asking for more new tokens than that must be clamped."""
    from transformers import AutoTokenizer

    from ftune.tiny import build_tiny_llama

    folder = tmp_path_factory.mktemp("short") / "model"
    build_tiny_llama(folder, AutoTokenizer.from_pretrained(tiny_tokenizer_dir), max_positions=48)
    return folder


def test_generation_is_clamped_to_the_context_with_a_note(short_model, capsys):
    code = main(["generate", str(short_model), "--prompt", "hello there", "--max-new-tokens", "100000000",
                 "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)["results"][0]
    assert "note: generating at most" in err and "not 100000000" in err and "context of 48 positions" in err
    room = int(err.split("generating at most ")[1].split()[0])
    assert result["tokens"] <= room < 48


def test_chat_with_stdin_closed_ends_cleanly(short_model, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", None)  # what Python sets when the process starts with fd 0 closed
    assert main(["chat", str(short_model)]) == 0
    assert "chat" in _clean(capsys.readouterr().out)


# ------------------------------------------------------------------------------------------------ data, messages
def test_one_row_with_an_eval_split_is_a_located_error(tmp_path, tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    from ftune.recipe.schema import Recipe
    from tests.data_stage import build

    (tmp_path / "one.jsonl").write_text('{"text": "hello world"}\n')
    recipe = Recipe.model_validate({"name": "t", "model": {"path": "unused"},
                                    "data": {"train": [{"path": str(tmp_path / "one.jsonl")}], "eval": {"split": 0.1},
                                             "cache_dir": str(tmp_path / "cache")}})
    with pytest.raises(FtuneError) as info:
        build(recipe, AutoTokenizer.from_pretrained(tiny_tokenizer_dir), log=lambda _: None)
    assert "data.eval.split: 0.1 of 1 training row holds out no row" in info.value.message


def test_a_lost_lock_race_names_no_question_marks():
    from ftune.launch.lock import busy_error
    from ftune.rundir import RunDir

    err = busy_error(RunDir(Path("/r")), {})
    assert "?" not in err.message and "starting: its lock record is not written yet" in err.message
    assert "`kill PID`" in err.hint


def test_model_config_folder_without_config_json_and_gguf_paths(tmp_path):
    from ftune.errors import RecipeError
    from ftune.models.meta import _own_config, resolve_config
    from ftune.recipe.schema import Recipe

    with pytest.raises(RecipeError) as info:
        _own_config(str(tmp_path))
    assert "is a folder with no config.json in it" in info.value.problems[0].message
    recipe = Recipe.model_validate({"name": "t", "model": {"path": "llama-3-8b.Q4_K_M.gguf"},
                                    "data": {"train": [{"path": "d.jsonl"}]}})
    with pytest.raises(RecipeError) as info:
        resolve_config(recipe)
    (p,) = info.value.problems
    assert p.path == "model.path" and "is a GGUF file" in p.message and "hf download" not in p.hint


def test_a_big_yaml_without_aliases_is_not_called_an_alias_bomb(monkeypatch):
    from ftune.recipe import _yaml, parse_yaml

    monkeypatch.setattr(_yaml, "MAX_NODES", 50)  # the same check at a size that parses in no time
    [problem] = parse_yaml("x: [" + ",".join(["1"] * 60) + "]\n", "big.yaml").problems
    assert "has 63 YAML nodes; a recipe may have at most 50" in problem.message and "alias" not in problem.message
    [bomb] = parse_yaml('a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n', "bomb.yaml").problems
    assert "expands to more than 50 nodes through aliases (a YAML alias bomb?)" in bomb.message
