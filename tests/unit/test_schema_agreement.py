"""The committed JSON Schema agrees with `ftune validate`, checked by a standard Draft 2020-12 validator.

Everything validate accepts, the schema accepts: the shipped recipes and bases, every recipe the test
suite writes that validate accepts, and random mutations validate accepts. What it rejects key by key
(unknown keys, enums, types, ranges), the schema rejects at the same key.
"""

from __future__ import annotations

import ast
import json
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftune.errors import RecipeError
from ftune.recipe import load_recipe
from ftune.recipe.schema import Recipe
from tests.unit.test_recipe_fuzz import _paths  # every key path of a parsed recipe

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is in the `test` extra: pip install -e '.[test]'")

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "schemas" / "recipe.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
TOP_KEYS = set(Recipe.model_fields)
# What a probe adds under a partial recipe so that validate can load it (its own keys win).
FILLER = {"model": {"path": "m"}, "data": {"train": [{"path": "d.jsonl"}]}, "train": {"max_steps": 5}}


def schema_errors(data) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in VALIDATOR.iter_errors(data)]


def test_schema_is_valid_draft_2020_12():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert "cross-field" in SCHEMA["description"].lower() and "ftune validate" in SCHEMA["description"]


# ------------------------------------------------------------------------------- shipped recipes
SHIPPED = sorted(REPO.glob("recipes/**/*.yaml"))


def test_shipped_set_has_recipes_bases_and_demo():
    names = {p.relative_to(REPO / "recipes").as_posix() for p in SHIPPED}
    assert {"llama7b-lora.yaml", "bases/llama2-7b.yaml", "demo/arithmetic-lora.yaml"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.relative_to(REPO / "recipes").as_posix())
def test_shipped_recipe_accepted(path):
    assert schema_errors(yaml.safe_load(path.read_text())) == []


# ---------------------------------------------------------------------- recipes the suite writes
def _recipe_like(text: str) -> dict | None:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    if not isinstance(data, dict) or not data or not set(data) <= TOP_KEYS:
        return None
    return data if {"name", "model", "data", "extends"} & set(data) else None


def suite_recipes() -> list[tuple[str, dict]]:
    """Every string constant in tests/ that reads as a recipe or a base (inline YAML the tests write)."""
    found = {}
    for py in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(py.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and ":" in node.value:
                data = _recipe_like(node.value)
                if data is not None:
                    found.setdefault(node.value, (f"{py.name}:{node.lineno}", data))
    return list(found.values())


def _problems(data: dict) -> set[str] | None:
    """The key paths `ftune validate`'s loader reports for `data` (empty: accepted; None: not loadable here).

    A partial recipe is loaded on a minimal base: the bases a recipe names are written as that base, and a
    base file (no `name`) is extended, after that base, by a probe recipe."""
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        names = data.get("extends")
        names = [names] if isinstance(names, str) else names if isinstance(names, list) else []
        for name in [n for n in names if isinstance(n, str)]:
            if Path(name).is_absolute() or ".." in Path(name).parts or "$" in name:
                return None
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(yaml.safe_dump(FILLER))
        if "name" not in data:  # a base: checked through a recipe extending the minimal base, then it
            (root / "filler.yaml").write_text(yaml.safe_dump(FILLER))
            (root / "base.yaml").write_text(yaml.safe_dump(data))
            data = {"name": "probe", "extends": ["filler.yaml", "base.yaml"]}
        (root / "r.yaml").write_text(yaml.safe_dump(data))
        try:
            load_recipe(root / "r.yaml")
        except RecipeError as err:
            return {p.path for p in err.problems}
    return set()


def validate_accepts(data: dict) -> bool:
    return _problems(data) == set()


SUITE = suite_recipes()


def test_suite_recipes_found():
    """The scan finds the inline recipes of the suite (a guard against it silently finding none)."""
    accepted = [where for where, data in SUITE if validate_accepts(data)]
    assert len(SUITE) >= 20 and len(accepted) >= 15, (len(SUITE), accepted)
    assert any(w.startswith("test_recipe_load.py") for w in accepted)
    assert any(w.startswith("test_cli_validate.py") for w in accepted)


@pytest.mark.parametrize("case", SUITE, ids=[w for w, _ in SUITE])
def test_suite_recipe_accepted_when_validate_accepts(case):
    where, data = case
    if not validate_accepts(data):
        pytest.skip("validate rejects it too (a test's invalid input)")
    assert schema_errors(data) == [], where


# ------------------------------------------------------------------------------------ mutations
SEED = yaml.safe_load((REPO / "recipes" / "llama7b-lora.yaml").read_text())
STANDALONE = load_recipe(REPO / "recipes" / "llama7b-lora.yaml").recipe.model_dump(mode="json", exclude={"extends"})




def _set(data, path: tuple, value) -> None:
    """Set `path` to `value` where the path still exists (an earlier mutation may have replaced a parent)."""
    for part in path[:-1]:
        ok = isinstance(data, dict) and part in data or isinstance(data, list) and isinstance(part, int) and part < len(data)
        if not ok:
            return
        data = data[part]
    last = path[-1]
    if isinstance(data, dict) and isinstance(last, str) or isinstance(data, list) and isinstance(last, int) and last < len(data):
        data[last] = value


PATHS = [p for p in _paths(STANDALONE) if p[0] != "peft"]  # peft's keys depend on the method: own cases below
VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 70000), st.floats(-2, 2, allow_nan=False), st.text(max_size=6),
    st.sampled_from(["${name}", "${env:FT_SCHEMA_UNSET,4}", "${train.seed}", "3", "2e-4", "yes", "auto", "bf16",
                     "all-linear", "nf4", "-1", "1.5", "0.5"]),
    st.lists(st.sampled_from(["q_proj", "tensorboard", "3"]), max_size=2),
)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutations_validate_accepts_are_schema_accepted(data):
    recipe = json.loads(json.dumps(STANDALONE))
    for _ in range(data.draw(st.integers(1, 2))):
        path = data.draw(st.sampled_from(PATHS))
        _set(recipe, path, data.draw(VALUES))
    if validate_accepts(recipe):
        assert schema_errors(recipe) == [], recipe


# ---------------------------------------------------------------------------- partial recipes
@pytest.mark.parametrize(
    "text",
    [
        "name: top\nextends: bases/base.yaml\npeft: {r: 16}\n",  # required keys from the base
        "extends: [a.yaml, b.yaml]\ntrain: {epochs: 1}\n",  # a base extending bases
        "model: {dtype: bfloat16}\ndata: {max_seq_length: 512}\n",  # a base: no name, partial sections
        "name: t\nextends: b.yaml\ndata: {eval: {}}\nquantization: {type: nf4}\npeft: {dropout: 0.1}\n",
        "distributed: {machine_rank: '${env:SLURM_NODEID,0}', num_processes: '${env:GPUS,auto}'}\n",
        "name: '${env:RUN,x}'\nmodel: {path: m, dtype: '${env:DTYPE,bfloat16}'}\ndata: {train: '${env:SRC}'}\n",
        "name: t\nmodel: {path: m}\ndata: {train: [{path: d}], eval: '${data.train}'}\nquantization: '${q}'\n",
    ],
    ids=["extends", "base-extends", "base", "extends-partial-sections", "interp-int", "interp-enum", "interp-section"],
)
def test_partial_and_interpolated_accepted(text):
    assert schema_errors(yaml.safe_load(text)) == []


# ----------------------------------------------------------------------------- invalid recipes
GOOD = {"name": "t", "model": {"path": "m"}, "data": {"train": [{"path": "d.jsonl"}]}, "train": {"max_steps": 5}}


def _with(path: str, value, base: dict = GOOD) -> dict:
    data = json.loads(json.dumps(base))
    *parents, last = path.split(".")
    node = data
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    return data


EXTENDS = {"name": "t", "extends": "bases/base.yaml"}
INVALID = {
    # case: (recipe, key validate names, where the schema reports it)
    "unknown-top-key": (_with("lr", 1), "lr", ""),
    "unknown-nested-key": (_with("train.lr", 1), "train.lr", "train"),
    "unknown-key-in-extending-recipe": (_with("model.pth", "m", EXTENDS), "model.pth", "model"),
    "unknown-key-in-base": (_with("train.max_stpes", 5, {"model": {"path": "m"}}), "train.max_stpes", "train"),
    "unknown-peft-key": (_with("peft", {"method": "lora", "rank": 8}), "peft.rank", "peft"),
    "key-of-another-method": (_with("peft", {"method": "prefix", "r": 8}), "peft.r", "peft"),
    "bad-enum": (_with("model.dtype", "float64"), "model.dtype", "model.dtype"),
    "bad-enum-in-list": (_with("output.report_to", ["tensorbord"]), "output.report_to[0]", "output.report_to.0"),
    "bad-method": (_with("peft", {"method": "lora2"}), "peft.method", "peft"),
    "wrong-type": (_with("train.per_device_batch_size", [1]), "train.per_device_batch_size", "train.per_device_batch_size"),
    "wrong-type-string-for-int": (_with("train.max_steps", "5x"), "train.max_steps", "train.max_steps"),
    "wrong-type-section": (_with("model", 3), "model", "model"),
    "wrong-type-list": (_with("data.train", {"path": "d"}), "data.train", "data.train"),
    "out-of-range": (_with("distributed.main_process_port", 70000), "distributed.main_process_port", "distributed.main_process_port"),
    "out-of-range-float": (_with("data.eval", {"split": 1.5}), "data.eval.split", "data.eval"),
    "out-of-range-in-base": (_with("train.gradient_accumulation_steps", 0, {"model": {"path": "m"}}),
                             "train.gradient_accumulation_steps", "train.gradient_accumulation_steps"),
    "empty-list": (_with("data.train", []), "data.train", "data.train"),
    "bad-name": (_with("name", "has space"), "name", "name"),
    "missing-required": ({"name": "t", "data": GOOD["data"]}, "model", ""),
    "missing-nested-required": (_with("model", {"dtype": "bfloat16"}), "model.path", "model"),
    "missing-required-in-list": (_with("data.train", [{"format": "text"}]), "data.train[0].path", "data.train.0"),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_rejected_by_both_at_the_same_key(case):
    data, key, schema_at = INVALID[case]
    assert key in (_problems(data) or set()), f"validate should reject {case} at {key}"
    errors = list(VALIDATOR.iter_errors(data))
    assert errors, f"the schema accepts {case}"
    assert schema_at in {".".join(map(str, e.absolute_path)) for e in errors}, schema_errors(data)
