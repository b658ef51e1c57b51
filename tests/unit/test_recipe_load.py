"""load_recipe: extends (deep merge, lists replaced), overrides, ${} interpolation, secrets, origins."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from ftune.errors import Location, RecipeError, UsageError
from ftune.recipe import MASK, LoadedRecipe, load_recipe

BASE = """\
model:
  path: base-model
  dtype: bfloat16
data:
  train:
    - path: a.jsonl
    - path: b.jsonl
  max_seq_length: 512
peft:
  method: lora
  r: 8
  target_modules: [q_proj, v_proj]
train:
  epochs: 2
  learning_rate: 1.0e-4
"""

TOP = """\
name: top
extends: bases/base.yaml
data:
  train:
    - path: c.jsonl
peft:
  r: 16
train:
  learning_rate: 3.0e-4
output:
  dir: runs/${name}-${peft.r}
"""


@pytest.fixture
def files(tmp_path):
    (tmp_path / "bases").mkdir()
    (tmp_path / "bases" / "base.yaml").write_text(BASE)
    (tmp_path / "top.yaml").write_text(TOP)
    return tmp_path


def test_extends_deep_merges_and_replaces_lists(files):
    loaded = load_recipe(files / "top.yaml")
    r = loaded.recipe
    assert r.model.path == "base-model" and r.model.dtype == "bfloat16"  # from the base
    assert [s.path for s in r.data.train] == ["c.jsonl"]  # list replaced, not appended
    assert r.data.max_seq_length == 512  # sibling of the replaced list kept
    assert (r.peft.r, list(r.peft.target_modules)) == (16, ["q_proj", "v_proj"])  # merged
    assert (r.train.epochs, r.train.learning_rate) == (2, 3e-4)
    assert loaded.file == str(files / "top.yaml")
    assert loaded.files == [str(files / "top.yaml"), str(files / "bases" / "base.yaml")]


def test_several_bases_later_wins(files):
    (files / "bases" / "fast.yaml").write_text("train:\n  epochs: 1\n  max_steps: 10\n")
    (files / "top.yaml").write_text(TOP.replace("extends: bases/base.yaml", "extends: [bases/base.yaml, bases/fast.yaml]"))
    r = load_recipe(files / "top.yaml").recipe
    assert (r.train.epochs, r.train.max_steps, r.train.learning_rate) == (1, 10, 3e-4)


def test_base_of_a_base(files):
    (files / "bases" / "root.yaml").write_text("description: from the root\nmodel: {path: root-model, task: causal-lm}\n")
    (files / "bases" / "base.yaml").write_text("extends: root.yaml\n" + BASE)
    loaded = load_recipe(files / "top.yaml")
    assert loaded.recipe.description == "from the root"
    assert loaded.recipe.model.path == "base-model"
    assert loaded.recipe.extends == "bases/base.yaml"  # only the top recipe's own extends stays
    assert len(loaded.files) == 3


def test_peft_method_change_replaces_base_section(files):
    (files / "top.yaml").write_text(TOP.replace("peft:\n  r: 16", "peft:\n  method: prefix\n  num_virtual_tokens: 4").replace("-${peft.r}", ""))
    r = load_recipe(files / "top.yaml").recipe
    assert (r.peft.method, r.peft.num_virtual_tokens) == ("prefix", 4)


def test_base_peft_without_method_is_lora_when_merging(files):
    (files / "bases" / "base.yaml").write_text(BASE.replace("  method: lora\n", ""))
    (files / "top.yaml").write_text(TOP.replace("peft:\n  r: 16", "peft:\n  method: prefix").replace("-${peft.r}", ""))
    assert load_recipe(files / "top.yaml").recipe.peft.method == "prefix"


def test_interpolation_references(files):
    assert load_recipe(files / "top.yaml").recipe.output.dir == "runs/top-16"


def test_env_interpolation_with_default_and_typing(files, monkeypatch):
    (files / "top.yaml").write_text(TOP + "  overwrite: ${env:FT_OVERWRITE,false}\n" + "model:\n  path: ${env:FT_MODEL}\n")
    monkeypatch.setenv("FT_MODEL", "/models/x")
    monkeypatch.delenv("FT_OVERWRITE", raising=False)
    r = load_recipe(files / "top.yaml").recipe
    assert r.model.path == "/models/x" and r.output.overwrite is False
    monkeypatch.setenv("FT_OVERWRITE", "true")
    assert load_recipe(files / "top.yaml").recipe.output.overwrite is True


def test_oc_env_works_too(files, monkeypatch):
    monkeypatch.setenv("FT_DESC", "hello")
    (files / "top.yaml").write_text(TOP + "description: ${oc.env:FT_DESC}\n")
    assert load_recipe(files / "top.yaml").recipe.description == "hello"


def test_secrets_are_masked_and_recorded(files, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_supersecret")
    (files / "top.yaml").write_text(TOP.replace("name: top", "name: top\nmodel:\n  hub_token: ${env:HF_TOKEN}"))
    loaded = load_recipe(files / "top.yaml")
    assert loaded.recipe.model.hub_token == MASK
    assert loaded.secrets == {"model.hub_token": "HF_TOKEN"}
    assert "hf_supersecret" not in loaded.resolved_yaml()
    assert "hf_supersecret" not in loaded.recipe.model_dump_json()


def test_secret_inside_a_string_masks_the_whole_value(files, monkeypatch):
    monkeypatch.setenv("MY_API_KEY", "k-123")
    (files / "top.yaml").write_text(TOP + "description: 'key ${env:MY_API_KEY,none}'\n")
    loaded = load_recipe(files / "top.yaml")
    assert loaded.recipe.description == MASK and loaded.secrets == {"description": "MY_API_KEY"}
    monkeypatch.delenv("MY_API_KEY")
    assert load_recipe(files / "top.yaml").recipe.description == "key none"  # the default is no secret


def test_secret_through_a_reference_is_masked(files, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    (files / "top.yaml").write_text(TOP + "model:\n  hub_token: ${env:HF_TOKEN}\n  revision: ${model.hub_token}\n")
    loaded = load_recipe(files / "top.yaml")
    assert (loaded.recipe.model.hub_token, loaded.recipe.model.revision) == (MASK, MASK)
    assert loaded.secrets == {"model.hub_token": "HF_TOKEN", "model.revision": "HF_TOKEN"}


def test_same_secret_in_two_variables_keeps_each_name(files, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "same")
    monkeypatch.setenv("MY_API_KEY", "same")
    (files / "top.yaml").write_text(TOP + "description: 'key ${env:MY_API_KEY}'\nmodel:\n  hub_token: ${env:HF_TOKEN}\n")
    assert load_recipe(files / "top.yaml").secrets == {"description": "MY_API_KEY", "model.hub_token": "HF_TOKEN"}


def test_non_secret_env_value_is_kept(files, monkeypatch):
    monkeypatch.setenv("FT_REV", "main")
    (files / "top.yaml").write_text(TOP.replace("name: top", "name: top\nmodel:\n  revision: ${env:FT_REV}"))
    loaded = load_recipe(files / "top.yaml")
    assert loaded.recipe.model.revision == "main" and loaded.secrets == {}


def test_overrides_typed_by_schema(files):
    loaded = load_recipe(
        files / "top.yaml",
        ["train.max_steps=5", "peft.target_modules=[q_proj]", "quantization=null", "data.train.0.path=z.jsonl", "name=other"],
    )
    r = loaded.recipe
    assert r.train.max_steps == 5 and isinstance(r.train.max_steps, int)
    assert list(r.peft.target_modules) == ["q_proj"]
    assert r.quantization is None
    assert r.data.train[0].path == "z.jsonl"
    assert r.output.dir == "runs/other-16"  # interpolation sees the override
    assert loaded.origins["train.max_steps"] == Location(origin="override")


def test_override_delete(files):
    r = load_recipe(files / "top.yaml", ["~train.learning_rate", "~data.max_seq_length"]).recipe
    assert r.train.learning_rate == 2e-4  # deleted from the merged recipe: the schema default applies
    assert r.data.max_seq_length is None


def test_override_changing_method_drops_other_method_keys(files):
    r = load_recipe(files / "top.yaml", ["peft.method=full", "output.dir=runs/x"]).recipe
    assert r.peft.method == "full"


def test_override_method_on_a_section_without_method(files):
    (files / "top.yaml").write_text("name: t\nmodel: {path: m}\ndata: {train: [{path: d}]}\ntrain: {epochs: 1}\npeft: {r: 4}\n")
    r = load_recipe(files / "top.yaml", ["peft.method=prefix"]).recipe
    assert (r.peft.method, r.peft.num_virtual_tokens) == ("prefix", 20)
    assert load_recipe(files / "top.yaml", ["peft.method=lora"]).recipe.peft.r == 4  # same method: keys kept


def test_override_value_that_is_not_yaml_stays_text(files):
    assert load_recipe(files / "top.yaml", ["description=[draft"]).recipe.description == "[draft"


def test_malformed_override_is_usage_error(files):
    with pytest.raises(UsageError) as err:
        load_recipe(files / "top.yaml", ["train.max_steps", "=3"])
    assert "'train.max_steps'" in err.value.message and "'=3'" in err.value.message
    assert err.value.exit_code == 2


def test_missing_file_is_usage_error(tmp_path):
    with pytest.raises(UsageError) as err:
        load_recipe(tmp_path / "nope.yaml")
    assert "recipe file not found" in err.value.message and err.value.exit_code == 2


def test_origins_point_at_file_base_override_default(files):
    loaded = load_recipe(files / "top.yaml", ["train.seed=7"])
    o = loaded.origins
    assert o["name"] == Location(str(files / "top.yaml"), 1, 1)
    assert o["model.path"] == Location(str(files / "bases" / "base.yaml"), 2, 3)
    assert o["peft.r"] == Location(str(files / "top.yaml"), 7, 3)
    assert o["train.seed"] == Location(origin="override")
    assert o["train.optimizer"] == Location(origin="default")
    assert o["data.train.0.path"] == Location(str(files / "top.yaml"), 5, 7)


def test_resolved_yaml_round_trips_and_keeps_schema_order(files):
    loaded = load_recipe(files / "top.yaml")
    text = loaded.resolved_yaml()
    data = yaml.safe_load(text)
    assert list(data)[:5] == ["schema_version", "name", "description", "model", "data"]
    assert "extends" not in data
    assert data["output"]["dir"] == "runs/top-16"
    again = files / "again.yaml"
    again.write_text(text)
    assert load_recipe(again).recipe == loaded.recipe.model_copy(update={"extends": None})


def test_loaded_recipe_is_frozen(files):
    loaded = load_recipe(files / "top.yaml")
    assert isinstance(loaded, LoadedRecipe)
    with pytest.raises(dataclasses.FrozenInstanceError):
        loaded.file = "x"  # type: ignore[misc]


def test_peft_without_method_is_lora(files):
    (files / "top.yaml").write_text("name: t\nmodel: {path: m}\ndata: {train: [{path: d}]}\ntrain: {epochs: 1}\npeft: {r: 4}\n")
    r = load_recipe(files / "top.yaml").recipe
    assert (r.peft.method, r.peft.r) == ("lora", 4)


def test_trust_remote_code_off_by_default(files):
    assert load_recipe(files / "top.yaml").recipe.model.trust_remote_code is False


def test_yaml_merge_keys_work(files):
    text = "name: t\nmodel: {path: m}\ndata: {train: [{path: d}]}\n_common: &c {epochs: 1, seed: 3}\n"
    (files / "top.yaml").write_text(text + "train:\n  <<: *c\n  seed: 4\n")
    with pytest.raises(RecipeError) as err:  # `_common` is not a recipe key: anchors live under real keys
        load_recipe(files / "top.yaml")
    assert [p.path for p in err.value.problems] == ["_common"]
    text = "name: t\nmodel: {path: m}\ndata: {train: [{path: d}]}\ntrain: &c {epochs: 1, seed: 3}\neval:\n  <<: *c\n"
    (files / "top.yaml").write_text(text)
    with pytest.raises(RecipeError) as err:
        load_recipe(files / "top.yaml")
    assert {p.path for p in err.value.problems} == {"eval.epochs", "eval.seed"}


def test_relative_and_nested_references(files, monkeypatch):
    monkeypatch.setenv("FT_ROOT", "/data")
    (files / "top.yaml").write_text(
        TOP.replace("output:\n  dir: runs/${name}-${peft.r}\n", "")
        + "description: ${model.path}\nmodel:\n  path: ${env:FT_ROOT}/m\n  tokenizer: ${.path}/tok\n"
        + "output:\n  dir: ${..name}\n"
    )
    r = load_recipe(files / "top.yaml").recipe
    assert (r.description, r.model.path, r.model.tokenizer, r.output.dir) == ("/data/m", "/data/m", "/data/m/tok", "top")
