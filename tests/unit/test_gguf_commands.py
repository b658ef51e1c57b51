"""`ftune data` and `ftune eval` with a recipe whose model.path is a .gguf convert it the way `ftune run` does (once,
into the cache keyed by its sha256) before they read its tokenizer or weights. The GGUF is the tiny Llama written
by ftune's own exporter (llama.cpp's writer), so the test is fast and needs no real model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("gguf", reason="the `gguf` package is not installed (pip install -e .[real])")

from ftune.cli.main import main  # noqa: E402
from tests.e2e._util import write_recipe  # noqa: E402


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory, tiny_model_dir) -> Path:
    from ftune.gguf import export

    out = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    export.export(tiny_model_dir, out, "f16", log=lambda line: None)
    return out


def _recipe(folder: Path, gguf_file: Path, data_file: Path) -> Path:
    return write_recipe(folder, {
        "name": "gguf", "model": {"path": str(gguf_file)},
        "data": {"train": [{"path": str(data_file), "format": "text", "limit": 16}], "max_seq_length": 32,
                 "eval": {"split": 0.25}},
        "peft": {"method": "lora", "r": 4}, "train": {"max_steps": 1},
        "output": {"dir": str(folder / "run")}})


def _converted(cache: Path) -> list[Path]:
    return sorted(p for p in cache.glob("gguf-llama-*") if not p.name.endswith(".config"))


@pytest.mark.parametrize("command", ["data", "eval"])
def test_data_and_eval_convert_a_gguf_once(command, tiny_gguf, tiny_model_dir, text_data_file, tmp_path,
                                           monkeypatch, capsys):
    cache = tmp_path / "cache"
    monkeypatch.setenv("FTUNE_MODEL_CACHE", str(cache))  # a fresh cache: nothing converted yet
    recipe = _recipe(tmp_path, tiny_gguf, text_data_file)
    # eval scores a trained model (here the tiny Llama itself) with the recipe's tokenizer: the converted folder's
    argv = ["data", str(recipe), "--format", "json"] if command == "data" else \
        ["eval", str(recipe), "--model", str(tiny_model_dir), "--format", "json"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert len(_converted(cache)) == 1 and (_converted(cache)[0] / "tokenizer.json").is_file()
    assert "tiny.gguf: dequantizing the GGUF (llama, " in err, err  # the conversion said so, on stderr
    shown = json.loads(out)  # stdout stays pure JSON
    if command == "data":
        from transformers import AutoTokenizer

        ids = shown["samples"][0]["input_ids"]  # tokenized by the tokenizer the GGUF carried, as the original does
        original = AutoTokenizer.from_pretrained(tiny_model_dir)
        want = original(original.decode(ids, skip_special_tokens=True))["input_ids"]
        assert len(want) > 3 and ids[:len(want)] == want  # (the data stage appends EOS)
    else:
        assert shown["metrics"]["eval_loss"] > 0
    assert main(argv) == 0  # the second time from the cache: no conversion
    assert "dequantizing" not in capsys.readouterr().err
