"""`model.path` at a GGUF: the header and metadata checks, and the compiler's located refusals (nothing cached).

The files here are written with llama.cpp's own writer (the `gguf` package) and hold one small tensor: enough for
the reader, never a model. The real SmolLM2 GGUF's happy path is tests/e2e/test_real_model.py.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf", reason="the `gguf` package is not installed (pip install -e .[real])")

from ftune.errors import RecipeError  # noqa: E402
from ftune.gguf import GgufError, header_problem, inspect, supported_architectures  # noqa: E402
from tests.e2e._util import write_recipe  # noqa: E402


def write_gguf(path: Path, arch: str = "llama", name: str = "tiny") -> Path:
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    writer.add_block_count(3)
    writer.add_context_length(256)
    writer.add_tensor("token_embd.weight", np.arange(64, dtype=np.float32).reshape(8, 8))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_sound_file_reads_from_its_metadata(tmp_path):
    info = inspect(write_gguf(tmp_path / "m.gguf"))
    assert (info.architecture, info.name, info.tensors, info.version) == ("llama", "tiny", 1, 3)
    assert len(info.sha256) == 64
    assert "llama" in supported_architectures() and "qwen2" in supported_architectures()


def test_not_gguf_short_and_bad_version(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04 a zip, not a gguf")
    assert "not a GGUF file" in header_problem(junk)
    short = tmp_path / "short.gguf"
    short.write_bytes(b"GGUF\x03\x00")
    assert "truncated" in header_problem(short)
    good = write_gguf(tmp_path / "v.gguf").read_bytes()
    bad = tmp_path / "v9.gguf"
    bad.write_bytes(good[:4] + struct.pack("<I", 9) + good[8:])
    assert "version 9" in header_problem(bad)


@pytest.mark.parametrize("keep", [0.5, 0.97])
def test_a_truncated_file_is_refused(tmp_path, keep):
    data = write_gguf(tmp_path / "m.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(GgufError, match="truncated"):
        inspect(cut)


def test_an_unsupported_architecture_names_it_and_the_supported_ones(tmp_path):
    with pytest.raises(GgufError) as err:
        inspect(write_gguf(tmp_path / "r.gguf", arch="rwkv6"))
    assert "`rwkv6` model" in err.value.message and "llama" in err.value.hint


def _recipe(tmp_path: Path, model: dict) -> Path:
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello"}\n')
    return write_recipe(tmp_path, {"schema_version": 1, "name": "g", "model": model,
                                   "data": {"train": [{"path": str(data), "format": "text"}]},
                                   "peft": {"method": "lora"}, "train": {"max_steps": 1},
                                   "output": {"dir": str(tmp_path / "run")}})


@pytest.mark.parametrize("case", ["unsupported", "truncated", "missing"])
def test_the_compiler_refuses_located_and_caches_nothing(tmp_path, monkeypatch, case):
    from ftune.plan.compile import compile_plan
    from ftune.recipe import load_recipe

    monkeypatch.setenv("FTUNE_MODEL_CACHE", str(tmp_path / "cache"))
    file = write_gguf(tmp_path / "m.gguf", arch="rwkv6" if case == "unsupported" else "llama")
    if case == "truncated":
        file.write_bytes(file.read_bytes()[:-40])
    if case == "missing":
        file.unlink()
    recipe = _recipe(tmp_path, {"path": str(tmp_path), "gguf_file": "m.gguf"})
    with pytest.raises(RecipeError) as err:
        compile_plan(load_recipe(recipe))
    text = err.value.render()
    assert f"{recipe}:" in text and "model.gguf_file:" in text, text
    assert {"unsupported": "does not support", "truncated": "truncated", "missing": "not found"}[case] in text
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_init_random_with_a_gguf_is_refused(tmp_path, monkeypatch):
    from ftune.plan.compile import compile_plan
    from ftune.recipe import load_recipe

    monkeypatch.setenv("FTUNE_MODEL_CACHE", str(tmp_path / "cache"))
    recipe = _recipe(tmp_path, {"path": str(write_gguf(tmp_path / "m.gguf")), "init": "random"})
    with pytest.raises(RecipeError, match="problem") as err:
        compile_plan(load_recipe(recipe))
    assert "model.init: `init: random`" in err.value.render()


def test_the_plan_names_the_cached_folder_and_reads_no_weight(tmp_path, monkeypatch):
    """A sound GGUF compiles: model_load.path is the sha-keyed cache folder (not written yet: `run` converts),
    model_load.gguf the source, model.config a config.json built from the metadata alone; a note says so."""
    from ftune.gguf import converted_folder
    from ftune.plan.compile import compile_plan
    from ftune.recipe import load_recipe

    monkeypatch.setenv("FTUNE_MODEL_CACHE", str(tmp_path / "cache"))
    file = write_gguf(tmp_path / "m.gguf")
    plan = compile_plan(load_recipe(_recipe(tmp_path, {"path": str(file)})), check_inputs=False)
    folder = converted_folder(inspect(file))
    assert plan.model_load.path == str(folder) and not folder.exists()
    assert plan.model_load.gguf.file == str(file.resolve()) and plan.model_load.gguf.architecture == "llama"
    config = Path(plan.recipe.model.config) / "config.json"
    assert config.is_file() and '"model_type": "llama"' in config.read_text()
    text = config.read_text()  # through transformers' GGUF key table: llama.block_count, llama.context_length
    assert '"num_hidden_layers": 3' in text and '"max_position_embeddings": 256' in text
    assert any("dequantized copy" in n for n in plan.notes)
