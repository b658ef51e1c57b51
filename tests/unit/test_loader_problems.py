"""One problem shape from YAML to message: the loader's schema, interpolation, secret and rule checks all return
`Problem`s (no second type, no round trip through another spelling), each keeps its message and hint, and is located
where its anchor says (the value, the key, or the mapping missing a key), spelled `data.train[1].format`."""

from __future__ import annotations

import pytest

from ftune.errors import Problem, RecipeError, key, key_path
from ftune.recipe import load_recipe
from ftune.recipe._schema import check_key, translate

RECIPE = """\
name: t
model:
  path: m
  add_tokens: ["<a>", "  "]
data:
  train:
    - path: d.jsonl
    - path: e.jsonl
      format: txet
train:
  max_stpes: 5
  learning_rate: ${nowhere.lr}
"""


def _load(folder, text: str) -> dict[str, Problem]:
    f = folder / "r.yaml"
    f.write_text(text)
    with pytest.raises(RecipeError) as err:
        load_recipe(f)
    return {p.path: p for p in err.value.problems}


@pytest.fixture(scope="module")
def problems(tmp_path_factory) -> dict[str, Problem]:
    return _load(tmp_path_factory.mktemp("loader"), RECIPE)


def _at(p: Problem) -> tuple[int | None, int | None]:
    return p.location.line, p.location.column


def test_every_problem_is_spelled_one_way_and_located_in_the_file(problems):
    assert set(problems) == {"model.add_tokens[1]", "data.train[1].format", "train.max_stpes", "train.learning_rate"}
    for path, p in problems.items():
        assert type(p) is Problem and key(key_path(path)) == path
        assert p.location.file.endswith("r.yaml") and p.severity == "error" and p.hint


def test_a_bad_value_points_at_the_value(problems):
    p = problems["data.train[1].format"]
    assert _at(p) == (9, 15)  # `txet`
    assert "invalid value 'txet' (did you mean 'text'?)" in p.message and "allowed values:" in p.hint


def test_an_unknown_key_points_at_the_key(problems):
    p = problems["train.max_stpes"]
    assert _at(p) == (11, 3) and "did you mean 'max_steps'?" in p.message and "allowed keys under `train`" in p.hint


def test_a_missing_key_points_at_the_mapping_that_lacks_it(tmp_path):
    text = RECIPE.replace("    - path: e.jsonl\n      format: txet\n", "    - fields: {text: t}\n")
    p = _load(tmp_path, text)["data.train[1].path"]
    assert _at(p) == (8, 7) and p.message == "required key is missing" and p.hint  # at `- fields: ...`


def test_a_rule_spelling_an_index_with_a_dot_comes_out_in_the_one_spelling(problems):
    """Also: the rules still run when a list item holds a bad value (`data.train[1].format`): the loader checks them on
    the recipe without it, and keeps what is unrelated."""
    p = problems["model.add_tokens[1]"]  # the rule says `model.add_tokens.1`
    assert _at(p) == (4, 23) and "can't be empty" in p.message


def test_an_interpolation_problem_keeps_its_hint(problems):
    p = problems["train.learning_rate"]
    assert _at(p) == (12, 18) and "nowhere" in p.message and p.hint


def test_the_loader_helpers_return_problems():
    from pydantic import ValidationError

    from ftune.recipe.schema import Recipe

    with pytest.raises(ValidationError) as err:
        Recipe.model_validate({"name": "t", "model": {"path": "m"}, "data": {"train": [{"path": "d", "formt": "x"}]}})
    (p,) = translate(err.value.errors(include_url=False))
    assert (type(p), p.path, p.anchor) == (Problem, "data.train[0].formt", "key")
    p = check_key(("train", "max_stpes"), "lora", {})
    assert (type(p), p.path, p.anchor) == (Problem, "train.max_stpes", "key")
    assert Problem.at("data.train.0.path", "m").path == "data.train[0].path"
    assert Problem.at(("data", "train", 0, "path"), "m").path == "data.train[0].path"
