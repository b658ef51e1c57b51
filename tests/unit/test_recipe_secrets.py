"""Secrets: a secret-named key's value (an override, a literal) is masked like an environment secret in the
Recipe, the plan, `ftune show` and every message; its value reaches the run through the environment only;
a secret inside a path is a located error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ftune.cli.main import main
from ftune.errors import RecipeError, UsageError
from ftune.plan.compile import compile_plan
from ftune.recipe import MASK, load_recipe
from ftune.recipe._secrets import is_secret_key, shown_override
from ftune.tiny import CONFIG

TOKEN = "hf_VERYsecretVALUE123"
GEN = "FTUNE_SECRET_MODEL_HUB_TOKEN"


@pytest.fixture
def recipe(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(CONFIG))  # a tiny Llama, no weights
    (tmp_path / "d.jsonl").write_text('{"text": "hello"}\n')
    path = tmp_path / "r.yaml"
    path.write_text(f"name: t\nmodel:\n  path: {model}\ndata:\n  train:\n    - path: d.jsonl\ntrain:\n  max_steps: 2\n"
                    f"output:\n  dir: {tmp_path / 'runs' / 't'}\n")
    return path


def problems(path: Path, overrides=()) -> list:
    with pytest.raises(RecipeError) as err:
        load_recipe(path, overrides)
    return err.value.problems


def where(p) -> tuple:
    return (Path(p.location.file).name if p.location.file else p.location.origin, p.location.line, p.location.column)


# ------------------------------------------------------------------------------ override secrets
def test_override_secret_is_masked_and_carried_in_the_environment_only(recipe):
    loaded = load_recipe(recipe, [f"model.hub_token={TOKEN}"])
    assert loaded.recipe.model.hub_token == MASK
    assert loaded.secrets == {"model.hub_token": GEN}
    assert loaded.secret_env == {GEN: TOKEN}
    assert loaded.secret("model.hub_token") == TOKEN
    assert TOKEN not in loaded.resolved_yaml() and TOKEN not in repr(loaded)


def test_override_secret_never_reaches_plan_json(recipe, monkeypatch):
    loaded = load_recipe(recipe, [f"model.hub_token={TOKEN}"])
    plan = compile_plan(loaded, check_inputs=False)
    dumped = plan.model_dump_json()
    assert TOKEN not in dumped and json.loads(dumped)["secrets"] == {"model.hub_token": GEN}
    assert plan.secret("model.hub_token") is None  # not in this environment until the launcher sets it
    for name, value in loaded.secret_env.items():  # what the launcher does for the workers
        monkeypatch.setenv(name, value)
    assert plan.secret("model.hub_token") == TOKEN


def test_literal_secret_in_the_recipe_is_masked_too(recipe):
    recipe.write_text(recipe.read_text().replace("  path: /", f"  hub_token: {TOKEN}\n  path: /", 1))
    loaded = load_recipe(recipe)
    assert (loaded.recipe.model.hub_token, loaded.secrets, loaded.secret_env) == (MASK, {"model.hub_token": GEN}, {GEN: TOKEN})


def test_secret_key_from_a_plainly_named_variable_keeps_that_variable(recipe, monkeypatch):
    monkeypatch.setenv("MY_HF", TOKEN)  # not a secret name: masked because of the key it lands in
    loaded = load_recipe(recipe, ["model.hub_token=${env:MY_HF}"])
    assert (loaded.recipe.model.hub_token, loaded.secrets, loaded.secret_env) == (MASK, {"model.hub_token": "MY_HF"}, {})


def test_env_secret_keeps_its_own_variable(recipe, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    loaded = load_recipe(recipe, ["model.hub_token=${env:HF_TOKEN}"])
    assert (loaded.secrets, loaded.secret_env) == ({"model.hub_token": "HF_TOKEN"}, {})


def test_secret_key_names_are_words_not_substrings(recipe):
    assert [is_secret_key(k) for k in ("hub_token", "api_key", "apiKey", "password", "tokenizer",
                                       "num_virtual_tokens", "keep", "author")] == [True] * 4 + [False] * 4
    loaded = load_recipe(recipe, ["model.tokenizer=tok", "peft.method=prefix", "peft.num_virtual_tokens=7"])
    assert (loaded.recipe.model.tokenizer, loaded.recipe.peft.num_virtual_tokens, loaded.secrets) == ("tok", 7, {})


# -------------------------------------------------------------------------------------- messages
def test_messages_never_quote_a_secret_override(recipe):
    found = problems(recipe, [f"model.hub_token={TOKEN}", f"train.max_steps={TOKEN}", "model.hub_token=[a]"])
    text = "\n".join(p.render() for p in found)
    assert TOKEN not in text
    p = next(p for p in found if p.path == "model.hub_token")
    assert (p.message, where(p)) == (f"expected a string, got a list (override 'model.hub_token={MASK}')", ("override", None, None))
    q = next(p for p in found if p.path == "train.max_steps")
    assert q.message == f"expected an integer, got '{MASK}' (override 'train.max_steps={MASK}')"


def test_malformed_secret_override_is_not_echoed(recipe):
    with pytest.raises(UsageError) as err:
        load_recipe(recipe, [f"~model.hub_token={TOKEN}"])
    assert TOKEN not in err.value.render() and f"~model.hub_token={MASK}" in err.value.message
    assert shown_override("train.max_steps=5") == "train.max_steps=5"


def test_show_masks_the_override_everywhere(recipe, capsys):
    for extra in ([], ["--origin"], ["--format", "json"], ["--origin", "--format", "json"]):
        code = main(["show", str(recipe), f"model.hub_token={TOKEN}", *extra])
        out = capsys.readouterr().out
        assert code == 0 and TOKEN not in out, extra
    main(["show", str(recipe), f"model.hub_token={TOKEN}", "--origin"])
    out = capsys.readouterr().out
    assert f"# overrides: model.hub_token={MASK}" in out
    assert f"model.hub_token (passed to the run as ${GEN}, never written)" in out
    assert yaml.safe_load(out.split("\n", 3)[3].replace("#", " #"))["model"]["hub_token"] == MASK


# ----------------------------------------------------------------------------------------- paths
def test_env_secret_interpolated_into_output_dir_is_located(recipe, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    recipe.write_text(recipe.read_text().rsplit("  dir:", 1)[0] + "  dir: runs/${env:HF_TOKEN}\n")
    (p,) = problems(recipe)
    assert (p.path, where(p)) == ("output.dir", ("r.yaml", 10, 8))
    assert p.message == "a secret can't be part of a path (it would show in file listings, logs and plan.json)"
    assert TOKEN not in p.render() and MASK not in p.render()


@pytest.mark.parametrize("key", ["name", "model.tokenizer", "data.train.0.path", "data.cache_dir", "output.dir"])
def test_override_secret_referenced_from_a_path_is_located(recipe, key):
    (p,) = problems(recipe, [f"model.hub_token={TOKEN}", f"{key}=x${{model.hub_token}}"])
    assert (p.path, where(p)) == (key.replace(".0.", "[0]."), ("override", None, None))  # as the recipe spells it
    assert p.message.startswith("a secret can't be part of a path") and TOKEN not in p.render()


def test_secret_written_into_a_path_literally_is_located(recipe):
    (p,) = problems(recipe, [f"model.hub_token={TOKEN}", f"data.train.0.path=data/{TOKEN}.jsonl"])
    assert p.path == "data.train[0].path" and TOKEN not in p.render()


def test_secret_in_free_text_is_still_masked_not_refused(recipe, monkeypatch):
    monkeypatch.setenv("MY_API_KEY", TOKEN)
    loaded = load_recipe(recipe, ["description=key ${env:MY_API_KEY}"])
    assert (loaded.recipe.description, loaded.secrets) == (MASK, {"description": "MY_API_KEY"})
