"""`ftune export gguf` on the tiny Llama: every outtype written with llama.cpp's writer and verified by reloading it
through transformers' GGUF loader; the refusals (an existing file, an architecture it isn't wired for, a failed
check) leave no file. The real model's round trip (LoRA run -> export -> same greedy answers) is in
tests/e2e/test_real_model.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("gguf", reason="the `gguf` package is not installed (pip install -e .[real])")

from ftune.gguf import export as gguf_export  # noqa: E402
from tests.e2e._util import ftune  # noqa: E402


@pytest.mark.parametrize("outtype", gguf_export.OUTTYPES)
def test_each_outtype_round_trips_within_its_tolerance(tiny_model_dir, tmp_path, outtype):
    out = tmp_path / f"tiny-{outtype}.gguf"
    result = gguf_export.export(tiny_model_dir, out, outtype, log=lambda s: None)
    assert out.is_file() and not list(tmp_path.glob(".*partial*"))
    assert result.max_diff <= gguf_export.TOLERANCE[outtype]
    config = json.loads((tiny_model_dir / "config.json").read_text())
    head = 0 if config.get("tie_word_embeddings") else 1
    assert result.tensors == 9 * config["num_hidden_layers"] + 2 + head  # 9 per layer, embeddings, final norm
    from ftune.gguf import inspect

    info = inspect(out)
    assert (info.architecture, info.tensors) == ("llama", result.tensors)
    if outtype == "f16":
        assert result.max_diff < 1e-2 and result.greedy_equal


def test_a_failed_check_deletes_the_file(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(gguf_export.TOLERANCE, "q8_0", 0.0)  # nothing passes a zero tolerance
    out = tmp_path / "tiny.gguf"
    with pytest.raises(gguf_export.ExportError, match="over the q8_0 tolerance"):
        gguf_export.export(tiny_model_dir, out, "q8_0", log=lambda s: None)
    assert list(tmp_path.iterdir()) == []


def test_cli_refuses_an_existing_file_and_an_unwired_architecture(tiny_model_dir, tmp_path):
    out = tmp_path / "m.gguf"
    out.write_text("keep me")
    r = ftune("export", "gguf", str(tiny_model_dir), "--out", str(out), cwd=tmp_path)
    assert r.code == 2 and "already exists and is not a GGUF `ftune export` wrote" in r.err
    assert out.read_text() == "keep me"

    other = tmp_path / "gpt2"
    shutil.copytree(tiny_model_dir, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"]}))
    r = ftune("export", "gguf", str(other), "--out", str(tmp_path / "g.gguf"), cwd=tmp_path)
    assert r.code == 3 and "GPT2LMHeadModel" in r.err and "no file written" in r.err, r.text
    assert not (tmp_path / "g.gguf").exists() and not list(tmp_path.glob(".g.gguf*"))
    r = ftune("export", "gguf", str(tiny_model_dir), "--out", str(out), "--force", cwd=tmp_path)
    assert r.code != 0 and out.read_text() == "keep me"  # --force never replaces a file ftune did not write
    ours = tmp_path / "ours.gguf"
    r = ftune("export", "gguf", str(tiny_model_dir), "--out", str(ours), "--json", cwd=tmp_path)
    assert r.code == 0, r.text
    assert json.loads(r.out)["outtype"] == "f16" and ours.read_bytes()[:4] == b"GGUF"
    r = ftune("export", "gguf", str(tiny_model_dir), "--out", str(ours), cwd=tmp_path)
    assert r.code == 2 and "already exists (a GGUF `ftune export` wrote)" in r.err  # ours, but no --force
    r = ftune("export", "gguf", str(tiny_model_dir), "--out", str(ours), "--force", cwd=tmp_path)
    assert r.code == 0, r.text  # ours (the marker in its header): replaced


@pytest.mark.slow
@pytest.mark.extended
def test_a_run_dir_is_merged_on_the_fly_and_exported(tiny_model_dir, text_data_file, tmp_path):
    """A LoRA run dir: merged in the temp dir (not inside the run, which the output policy keeps to the run's own
    files), exported beside final/ as <name>-f16.gguf, verified; the run dir gains only that file."""
    from tests.e2e._util import base_recipe, write_recipe

    recipe = base_recipe(tiny_model_dir, text_data_file, name="gx", train={"max_steps": 2},
                         checkpoint={"strategy": "no"}, output={"dir": str(tmp_path / "run"), "report_to": []})
    assert ftune("run", str(write_recipe(tmp_path, recipe)), cwd=tmp_path).code == 0
    before = set((tmp_path / "run").iterdir())
    r = ftune("export", "gguf", str(tmp_path / "run"), cwd=tmp_path)
    assert r.code == 0, r.text[-2000:]
    assert "merging" in r.out and "greedy next tokens equal" in r.out
    assert set((tmp_path / "run").iterdir()) - before == {tmp_path / "run" / "gx-f16.gguf"}
