"""Property: whatever the recipe text or overrides, loading returns a recipe or a report, never a crash."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftune.errors import RecipeError, UsageError
from ftune.recipe import LoadedRecipe, load_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
SEED = load_recipe(RECIPES / "llama7b-lora.yaml").resolved_yaml()
SEED_LINES = SEED.splitlines(keepends=True)
SEED_DATA = yaml.safe_load(SEED)
SETTINGS = settings(max_examples=80, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["${name}", "${nope}", "${env:FT_FUZZ_UNSET}", "${env:FT_FUZZ_UNSET,3}", "${oops", "auto", "lora"]),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)


def _paths(data, prefix=()):
    if isinstance(data, dict):
        for k, v in data.items():
            yield (*prefix, k)
            yield from _paths(v, (*prefix, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield (*prefix, i)
            yield from _paths(v, (*prefix, i))


PATHS = list(_paths(SEED_DATA))


def check(text: str, overrides=()) -> None:
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "r.yaml"
        f.write_text(text)
        try:
            result = load_recipe(f, overrides)
        except RecipeError as err:
            assert err.problems, "a RecipeError lists its problems"
            n_lines = max(1, text.count("\n") + 1)
            for p in err.problems:
                assert p.message and p.render()
                loc = p.location
                assert loc.file is not None or loc.origin == "override"
                if loc.file and loc.file.endswith("r.yaml") and loc.line is not None:
                    assert 1 <= loc.line <= n_lines + 1
        except UsageError as err:
            assert overrides and err.exit_code == 2
        else:
            assert isinstance(result, LoadedRecipe)


@SETTINGS
@given(st.data())
def test_text_mutations(data):
    lines = list(SEED_LINES)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(lines) - 1))
        op = data.draw(st.sampled_from(["delete", "duplicate", "indent", "dedent", "insert", "char", "swap"]))
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "indent":
            lines[i] = " " + lines[i]
        elif op == "dedent":
            lines[i] = lines[i][1:] if lines[i].startswith(" ") else lines[i]
        elif op == "insert":
            lines.insert(i, data.draw(st.sampled_from(["\t", "- x\n", "? a\n", "&a b\n", "*a\n", "!!python/none\n", "{\n", "'\n"])))
        elif op == "char":
            pos = data.draw(st.integers(0, max(0, len(lines[i]) - 1)))
            lines[i] = lines[i][:pos] + data.draw(st.sampled_from(list(":-[]{}#&*!|>'\"%@` \t"))) + lines[i][pos + 1 :]
        else:
            j = data.draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        if not lines:
            break
    check("".join(lines))


@SETTINGS
@given(st.data())
def test_value_mutations(data):
    doc = yaml.safe_load(SEED)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(PATHS))
        node = doc
        try:
            for part in path[:-1]:
                node = node[part]
            if data.draw(st.booleans()):
                node[path[-1]] = data.draw(values)
            elif isinstance(node, dict):
                node.pop(path[-1], None)
        except (KeyError, IndexError, TypeError):
            continue
    if data.draw(st.booleans()):
        doc[data.draw(st.text(min_size=1, max_size=8))] = data.draw(values)
    check(yaml.safe_dump(doc, sort_keys=False))


@SETTINGS
@given(st.lists(st.one_of(
    st.builds(lambda p, v: f"{p}={v}", st.sampled_from([".".join(map(str, p)) for p in PATHS] + ["peft.rnak", "x.y", "data.train.9.path"]),
              st.sampled_from(["5", "null", "[a, b]", "{a: 1}", "'", "!!python/none", "", "lora", "prefix", "-1", "${name}"])),
    st.builds(lambda p: "~" + p, st.sampled_from([".".join(map(str, p)) for p in PATHS] + ["nope"])),
    st.text(max_size=10),
), max_size=4))
def test_override_mutations(overrides):
    check(SEED, overrides)


@SETTINGS
@given(
    st.lists(st.sampled_from(["[", "{a: ", "- ", "a:\n" + " " * 2]), min_size=1, max_size=300),
    st.lists(st.lists(st.integers(0, 7), max_size=3), min_size=8, max_size=8),
    st.lists(st.sampled_from(["/etc/passwd", "../out.yaml", "nope.yaml", "x.txt", "", "\x00"]), max_size=2),
)
def test_hostile_structures(openers, graph, strays):
    """Deep nesting and any graph of bases (cycles, fan-out, escapes): a report or a recipe, with bounded work: each
    file composed at most once (the work, not the clock: a lost memo would compose a fan-out's files per path; the
    nesting is cut at `_yaml.MAX_DEPTH` before composing)."""
    from unittest import mock

    from ftune.recipe import _extends

    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "in"
        root.mkdir()
        (Path(d) / "out.yaml").write_text("description: OUTSIDE-TEXT\n")
        (root / "x.txt").write_text("TXT-TEXT\n")
        for i, edges in enumerate(graph):
            bases = [f"b{j}.yaml" for j in edges] + (strays if i == 0 else [])
            body = "".join(openers) if i == 7 else f"train: {{seed: {i}}}\n"
            (root / f"b{i}.yaml").write_text(f"extends: {json.dumps(bases)}\n{body}")
        (root / "r.yaml").write_text(SEED + "extends: [b0.yaml]\n")
        composed: dict[Path, int] = {}
        real = _extends._compose_once

        def counting(file, stack, ctx):
            composed[file] = composed.get(file, 0) + 1
            assert composed[file] == 1, f"{file.name} composed twice"
            return real(file, stack, ctx)

        with mock.patch.object(_extends, "_compose_once", counting):
            try:
                load_recipe(root / "r.yaml")
            except RecipeError as err:
                text = err.render()
                assert "OUTSIDE-TEXT" not in text and "TXT-TEXT" not in text
                assert all(p.location.file is not None for p in err.problems)
        assert len(composed) <= 9  # r.yaml and b0..b7, each once
