"""`ftune show`: the resolved recipe as YAML/JSON, overrides applied, --origin, secrets masked."""

from __future__ import annotations

import json

import pytest
import yaml

from ftune.cli.main import main


@pytest.fixture
def recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "base.yaml").write_text("model:\n  path: m\n  dtype: bfloat16\ntrain:\n  epochs: 2\n")
    (tmp_path / "r.yaml").write_text(
        "name: r\nextends: base.yaml\ndata:\n  train:\n    - path: d.jsonl\npeft:\n  r: 4\noutput:\n  dir: runs/${name}\n"
    )
    return tmp_path / "r.yaml"


def show(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["show", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_yaml_is_resolved_and_complete(recipe, capsys):
    code, out, _ = show(capsys, "r.yaml")
    assert code == 0
    assert out.startswith("# resolved from r.yaml (bases: base.yaml)\n")
    data = yaml.safe_load(out)
    assert data["model"] == {**data["model"], "path": "m", "dtype": "bfloat16", "trust_remote_code": False}
    assert data["output"]["dir"] == "runs/r"
    assert data["peft"]["r"] == 4 and data["peft"]["method"] == "lora"
    assert data["train"]["epochs"] == 2 and data["train"]["optimizer"] == "adamw_torch_fused"  # defaults filled
    assert list(data)[:4] == ["schema_version", "name", "description", "model"]


def test_overrides_applied(recipe, capsys):
    code, out, _ = show(capsys, "r.yaml", "train.max_steps=7", "peft.target_modules=[q_proj]", "name=x")
    data = yaml.safe_load(out)
    assert code == 0
    assert (data["train"]["max_steps"], data["peft"]["target_modules"], data["output"]["dir"]) == (7, ["q_proj"], "runs/x")
    assert "# overrides: train.max_steps=7 peft.target_modules=[q_proj] name=x" in out


def test_origin_annotations(recipe, capsys):
    code, out, _ = show(capsys, "r.yaml", "train.seed=1", "--origin")
    assert code == 0
    lines = {line.split(":")[0].strip() + ":" + line.split("#")[0].split(":", 1)[1].strip(): line.split("# ")[-1]
             for line in out.splitlines() if "#" in line and not line.startswith("#")}
    assert lines["path:m"] == "base.yaml:2:3"
    assert lines["r:4"] == "r.yaml:7:3"
    assert lines["seed:1"] == "override train.seed=1"
    assert lines["optimizer:adamw_torch_fused"] == "default"
    assert lines["target_modules:[q_proj, v_proj]"] == "default"
    assert "- path: d.jsonl" in out and "# r.yaml:5:7" in out
    assert yaml.safe_load(out)["data"]["train"][0]["path"] == "d.jsonl"  # still valid YAML


def test_json_with_origins(recipe, capsys):
    code, out, _ = show(capsys, "r.yaml", "--format", "json", "--origin")
    data = json.loads(out)
    assert code == 0
    assert data["recipe"]["model"]["path"] == "m"
    assert data["origins"]["model.path"] == "base.yaml:2:3"
    assert data["origins"]["train.seed"] == "default"


def test_secret_masked(recipe, capsys, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_verysecret")
    code, out, _ = show(capsys, "r.yaml", "model.hub_token=${env:HF_TOKEN}")
    assert code == 0 and "hf_verysecret" not in out
    assert yaml.safe_load(out)["model"]["hub_token"] == "***"
    assert "model.hub_token <- $HF_TOKEN" in out


def test_invalid_recipe_exit_1_on_stderr(recipe, capsys):
    code, out, err = show(capsys, "r.yaml", "peft.rank=8")
    assert code == 1 and out == ""
    assert "<override>: error: peft.rank: unknown key (did you mean 'r'?) (override 'peft.rank=8')" in err


def test_missing_file_exit_2(recipe, capsys):
    code, _, err = show(capsys, "nope.yaml")
    assert code == 2 and "recipe file not found: nope.yaml" in err
