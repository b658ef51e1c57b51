"""A model by hub id, the way clusters hold it (issue #45): `hf download` filled the Hugging Face cache, the job runs
with HF_HUB_OFFLINE=1 (tests/conftest.py sets it, and a temp HF_HOME). The tiny Llama is laid out as the hub client
writes it (blobs, snapshots/<sha> of symlinks, refs/main) under an org/name id; `validate --check-paths`, `plan`,
`run` (2 steps), `data`, `eval`, `merge` and `export gguf` all take it by id, and refuse an id the cache lacks
alike, naming the folder searched and the download command. `validate`, `plan`, `data` and `run`'s refusals are
cheap (no training) and run in `make test`; one tiny run, shared by the extended tests, covers eval, merge and
export."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.e2e._util import base_recipe, ftune, write_recipe

pytestmark = pytest.mark.slow
MODEL_ID = "acme-e2e/tiny-cached"
SHA = "0123456789abcdef0123456789abcdef01234567"


def cache_layout(source: Path, repo_id: str, sha: str = SHA, ref: str = "main") -> Path:
    """`source`'s files as the hub client caches them: $HF_HOME/hub/models--org--name/{blobs,snapshots/<sha>,refs}."""
    repo = Path(os.environ["HF_HOME"]) / "hub" / f"models--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / sha
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    for file in sorted(source.iterdir()):
        if file.is_file():
            blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
            shutil.copyfile(file, blob)
            (snap / file.name).symlink_to(os.path.relpath(blob, snap))
    (repo / "refs" / ref).write_text(sha)
    return repo


def cli(*args: str, capsys) -> tuple[int, str]:
    from ftune.cli.main import main

    capsys.readouterr()
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.fixture(scope="module")
def cached(tmp_path_factory, tiny_model_dir, text_data_file):
    """(folder, the cache's repo folder): the tiny Llama cached under MODEL_ID, a recipe naming it and one naming
    an id the cache lacks."""
    repo = cache_layout(tiny_model_dir, MODEL_ID)
    folder = tmp_path_factory.mktemp("hfcache")
    sections = dict(train={"max_steps": 2, "logging_steps": 1}, eval={"strategy": "no"},
                    checkpoint={"strategy": "no"}, output={"dir": "runs/c", "report_to": ["none"], "loss_curve": False})
    write_recipe(folder, base_recipe(MODEL_ID, text_data_file, name="cached", **sections))
    absent = {**sections, "output": {**sections["output"], "dir": "runs/a"}}
    write_recipe(folder, base_recipe("acme-e2e/absent", text_data_file, name="absent", **absent), "absent.yaml")
    yield folder, repo
    shutil.rmtree(repo, ignore_errors=True)


@pytest.fixture(scope="module")
def trained(cached) -> Path:
    """One 2-step LoRA run of the cached id, through `ftune run` (accelerate launch, a worker process)."""
    folder, _ = cached
    res = ftune("run", "recipe.yaml", cwd=folder)
    assert res.code == 0, res.text
    run = folder / "runs" / "c"
    assert json.loads((run / "final" / "adapter_config.json").read_text())["base_model_name_or_path"] == MODEL_ID
    return run


def test_validate_and_plan_take_a_cached_id_offline(cached, capsys, monkeypatch):
    folder, _ = cached
    monkeypatch.chdir(folder)
    assert os.environ["HF_HUB_OFFLINE"] == "1" and not Path(MODEL_ID).exists()
    code, out = cli("validate", "--check-paths", "recipe.yaml", capsys=capsys)
    assert code == 0 and "all valid" in out, out
    code, out = cli("plan", "recipe.yaml", "--format", "json", capsys=capsys)
    assert code == 0, out
    shown = json.loads(out)
    assert shown["missing"] == [] and shown["data"]["tokens"] > 0  # the cached snapshot's tokenizer counted them
    assert shown["model_load"]["path"] == MODEL_ID  # the worker loads the id: transformers finds the same snapshot


def test_an_id_the_cache_lacks_is_refused_alike_naming_the_folder_searched(cached, capsys, monkeypatch):
    folder, _ = cached
    monkeypatch.chdir(folder)
    hub = Path(os.environ["HF_HOME"]) / "hub"
    absent = ("model acme-e2e/absent: no such folder here, and not in the Hugging Face cache "
              f"(searched {hub / 'models--acme-e2e--absent'})")
    for command in (["validate", "--check-paths"], ["run"]):
        code, out = cli(*command, "absent.yaml", capsys=capsys)
        assert code == 1 and f"model.path: {absent}; the hub is offline (HF_HUB_OFFLINE=1)" in out, (command, out)
        assert "hint: download it where there is network, into the cache this job reads (HF_HOME): " \
               "`hf download acme-e2e/absent`" in out
    code, out = cli("data", "absent.yaml", capsys=capsys)
    assert code == 1 and f"cannot load the tokenizer: {absent}" in out, out
    code, out = cli("plan", "absent.yaml", capsys=capsys)  # plan falls back to the catalog, which lacks it too
    assert code == 1 and f"searched {hub / 'models--acme-e2e--absent'}" in out, out
    assert not (folder / "runs" / "a").exists()


@pytest.mark.extended
def test_run_eval_merge_and_export_take_a_cached_id_offline(cached, trained, capsys, monkeypatch):
    folder, repo = cached
    monkeypatch.chdir(folder)
    code, out = cli("eval", "recipe.yaml", "--format", "json", capsys=capsys)
    assert code == 0, out
    assert json.loads(out[out.index("{"):])["metrics"]["eval_loss"] > 0
    code, out = cli("merge", str(trained), "--dtype", "float32", "--out", str(folder / "merged"), capsys=capsys)
    assert code == 0 and (folder / "merged" / "config.json").is_file(), out
    code, out = cli("export", "gguf", MODEL_ID, "--out", str(folder / "tiny.gguf"), capsys=capsys)
    assert code == 0 and (folder / "tiny.gguf").stat().st_size > 0, out
    assert f"exported {repo / 'snapshots' / SHA} -> " in out


@pytest.mark.extended
def test_a_run_whose_base_left_the_cache_is_refused_alike(cached, trained, capsys, monkeypatch):
    folder, repo = cached
    monkeypatch.chdir(folder)
    hidden = repo.with_name("hidden")
    repo.rename(hidden)  # the trained run's base leaves the cache
    try:
        gone = f"acme-e2e/tiny-cached: no such folder here, and not in the Hugging Face cache (searched {repo})"
        code, out = cli("eval", "recipe.yaml", capsys=capsys)
        assert code == 1 and f"cannot load the tokenizer: model {gone}" in out, out
        for command in (["merge", "runs/c", "--out", "merged2"], ["export", "gguf", "runs/c", "--out", "c.gguf"]):
            code, out = cli(*command, capsys=capsys)
            assert code == 1 and f"needs its base model {gone}" in out and "`hf download acme-e2e/tiny-cached`" \
                in out, (command, out)
        code, out = cli("export", "gguf", MODEL_ID, "--out", "x.gguf", capsys=capsys)
        assert code == 2 and f"model {gone}" in out, out
        assert not any((folder / name).exists() for name in ("merged2", "c.gguf", "x.gguf"))
    finally:
        hidden.rename(repo)


@pytest.mark.extended
def test_a_cached_adapter_id_is_continued_over_its_cached_base(cached, trained, capsys, monkeypatch):
    """model.path at an adapter's hub id: its snapshot is the adapter continued, its base (a hub id too) is looked
    up in the cache the same way."""
    folder, _ = cached
    monkeypatch.chdir(folder)
    repo = cache_layout(trained / "final", "acme-e2e/tiny-adapter")
    try:
        code, out = cli("plan", "recipe.yaml", "model.path=acme-e2e/tiny-adapter", "output.dir=runs/ad",
                        "--format", "json", capsys=capsys)
        assert code == 0, out
        load = json.loads(out)["model_load"]
        assert (load["path"], load["adapter"]) == (MODEL_ID, str(repo / "snapshots" / SHA))
        import yaml

        spec = yaml.safe_load((folder / "recipe.yaml").read_text())
        spec["model"]["path"] = "acme-e2e/tiny-adapter"
        write_recipe(folder, spec, "adapter.yaml")
        code, out = cli("validate", "--check-paths", "adapter.yaml", capsys=capsys)
        assert code == 0, out
    finally:
        shutil.rmtree(repo, ignore_errors=True)
