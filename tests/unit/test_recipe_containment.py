"""Contained recipes: `extends` reads only YAML under the recipe's folder or FTUNE_RECIPE_PATH, each base
once, chains and nesting bounded; a refused target is never read, so nothing of it reaches a message."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftune.cli.main import main
from ftune.errors import RecipeError
from ftune.recipe import load_recipe
from ftune.recipe import _yaml
from ftune.recipe._yaml import MAX_DEPTH
from ftune.recipe.load import MAX_EXTENDS_DEPTH

REPO = Path(__file__).resolve().parents[2]
SECRET = "root:$6$SECRET-LINE-OF-THE-TARGET"
GOOD = "name: t\nmodel: {path: m}\ndata: {train: [{path: d.jsonl}]}\ntrain: {max_steps: 1}\n"


def problems(path: Path, overrides=()) -> list:
    with pytest.raises(RecipeError) as err:
        load_recipe(path, overrides)
    return err.value.problems


def where(p) -> tuple[str, int | None, int | None]:
    return Path(p.location.file).name, p.location.line, p.location.column


def everything(found) -> str:
    return "\n".join(p.render() for p in found)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file outside the recipe's folder whose text must never show (it is valid YAML: a real leak would parse)."""
    target = tmp_path / "private" / "shadow.yaml"
    target.parent.mkdir()
    target.write_text(f"model: {{path: '{SECRET}'}}\n{SECRET}: [\n")  # a mapping, then a syntax error quoting it
    return target


@pytest.fixture
def top(tmp_path: Path) -> Path:
    folder = tmp_path / "team" / "recipes"
    folder.mkdir(parents=True)
    return folder


@pytest.mark.parametrize("entry", ["ABS", "../../private/shadow.yaml", "bases/../../../private/shadow.yaml"])
def test_base_outside_the_folder_is_refused_unread(top, outside, entry, monkeypatch):
    entry = str(outside) if entry == "ABS" else entry
    monkeypatch.setattr(Path, "read_text", _guard(Path.read_text, outside), raising=True)
    (top / "r.yaml").write_text(GOOD + f"extends: '{entry}'\n")
    found = problems(top / "r.yaml")
    (p,) = found
    assert (p.path, where(p)) == ("extends", ("r.yaml", 5, 10))
    assert p.message == f"base recipe {entry!r} is outside the recipe's folder"
    assert "FTUNE_RECIPE_PATH" in p.hint
    assert SECRET not in everything(found)


def _guard(read_text, forbidden: Path):
    def guarded(self, *a, **k):
        assert self.resolve() != forbidden.resolve(), "a refused base was read"
        return read_text(self, *a, **k)

    return guarded


def test_symlink_escaping_the_folder_is_refused(top, outside):
    (top / "bases").mkdir()
    (top / "bases" / "llama.yaml").symlink_to(outside)
    (top / "r.yaml").write_text(GOOD + "extends: bases/llama.yaml\n")
    (p,) = problems(top / "r.yaml")
    assert (p.path, where(p)) == ("extends", ("r.yaml", 5, 10))
    assert "outside the recipe's folder" in p.message and SECRET not in p.render()


def test_symlink_inside_the_folder_is_followed(top):
    (top / "real.yaml").write_text("train: {learning_rate: 0.5}\n")
    (top / "link.yaml").symlink_to(top / "real.yaml")
    (top / "r.yaml").write_text(GOOD + "extends: link.yaml\n")
    assert load_recipe(top / "r.yaml").recipe.train.learning_rate == 0.5


def test_non_yaml_file_inside_the_folder_is_refused_unread(top):
    (top / "notes.txt").write_text(f"{SECRET}\n")
    (top / "r.yaml").write_text(GOOD + "extends: [notes.txt]\n")
    (p,) = problems(top / "r.yaml")
    assert (p.path, where(p), p.message) == ("extends", ("r.yaml", 5, 11), "base recipe 'notes.txt' is not a YAML file")
    assert SECRET not in p.render()


def test_base_of_a_base_stays_inside_the_top_recipes_folder(top, tmp_path):
    """A base's own `extends` is checked against the folder of the recipe that was run, not the base's."""
    (top / "bases").mkdir()
    (top / "bases" / "a.yaml").write_text("extends: ../shared.yaml\n")  # inside the top folder: fine
    (top / "shared.yaml").write_text("extends: ../../elsewhere.yaml\ntrain: {seed: 7}\n")  # escapes it
    (tmp_path / "elsewhere.yaml").write_text(f"description: '{SECRET}'\n")
    (top / "r.yaml").write_text(GOOD + "extends: bases/a.yaml\n")
    (p,) = problems(top / "r.yaml")
    assert (p.path, where(p)) == ("extends", ("shared.yaml", 1, 10))
    assert "outside the recipe's folder" in p.message and SECRET not in p.render()


def test_recipe_path_roots_allow_shared_bases(top, tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "base.yaml").write_text("train: {seed: 11}\n")
    (top / "r.yaml").write_text(GOOD + f"extends: {shared / 'base.yaml'}\n")
    assert "outside" in problems(top / "r.yaml")[0].message
    monkeypatch.setenv("FTUNE_RECIPE_PATH", os.pathsep.join(["/nonexistent", str(shared)]))
    assert load_recipe(top / "r.yaml").recipe.train.seed == 11


def test_syntax_error_in_an_allowed_base_is_quoted_where_it_is(top):
    (top / "b.yaml").write_text("model:\n  path: [m\n")
    (top / "r.yaml").write_text(GOOD + "extends: b.yaml\n")
    found = problems(top / "r.yaml")
    assert where(found[0])[0] == "b.yaml" and "YAML syntax error" in found[0].message


def test_validate_github_format_never_publishes_the_target(top, outside, capsys, monkeypatch):
    monkeypatch.chdir(top)
    (top / "r.yaml").write_text(GOOD + f"extends: [{outside}, ../../private/shadow.yaml]\n")
    code = main(["validate", "--format", "github", "r.yaml"])
    out = capsys.readouterr().out
    assert code == 1
    assert out.count("::error file=r.yaml,line=5,") == 2 and "outside the recipe's folder" in out
    assert SECRET not in out and "shadow.yaml: " not in out


def test_shipped_recipes_still_extend_their_bases():
    loaded = load_recipe(REPO / "recipes" / "llama7b-lora.yaml")
    assert [Path(f).name for f in loaded.files] == ["llama7b-lora.yaml", "llama2-7b.yaml"]


# ----------------------------------------------------------------------------------- bounded work
def _count_compositions(monkeypatch) -> list[int]:
    """How many times each file is composed in a load (one entry per file, growing as the load runs); a file
    composed twice fails at once, so a lost memo fails here instead of running for 2^30 paths."""
    from ftune.recipe import _extends

    seen: dict[Path, int] = {}
    counts: list[int] = []
    real = _extends._compose_once

    def counting(file, stack, ctx):
        seen[file] = seen.get(file, 0) + 1
        counts[:] = list(seen.values())
        assert seen[file] == 1, f"{file.name} composed twice"
        return real(file, stack, ctx)

    monkeypatch.setattr(_extends, "_compose_once", counting)
    return counts


def test_fan_out_of_bases_is_composed_once_each(top, monkeypatch):
    """30 levels, each base extending the next twice: 2^30 paths, 31 files composed."""
    for i in range(30):
        (top / f"f{i}.yaml").write_text(f"extends: [f{i + 1}.yaml, f{i + 1}.yaml]\ntrain: {{seed: {i}}}\n")
    (top / "f30.yaml").write_text("train: {learning_rate: 0.25}\n")
    (top / "r.yaml").write_text(GOOD + "extends: [f0.yaml, f1.yaml]\n")
    composed = _count_compositions(monkeypatch)
    loaded = load_recipe(top / "r.yaml")
    assert composed == [1] * 32  # each file once: the work, not the clock (2^30 paths would never end)
    assert (loaded.recipe.train.seed, loaded.recipe.train.learning_rate) == (1, 0.25)
    assert len(loaded.files) == 32


def test_problem_in_a_shared_base_is_reported_once(top):
    (top / "d.yaml").write_text("train: {lr: 1}\n")
    (top / "b.yaml").write_text("extends: d.yaml\n")
    (top / "c.yaml").write_text("extends: d.yaml\n")
    (top / "r.yaml").write_text(GOOD + "extends: [b.yaml, c.yaml]\n")
    (p,) = problems(top / "r.yaml")
    assert (p.path, where(p)) == ("train.lr", ("d.yaml", 1, 9))


def test_long_extends_chain_is_a_located_error(top, monkeypatch):
    for i in range(1500):
        (top / f"b{i}.yaml").write_text(f"extends: b{i + 1}.yaml\n")
    (top / "r.yaml").write_text(GOOD + "extends: b0.yaml\n")
    composed = _count_compositions(monkeypatch)
    (p,) = problems(top / "r.yaml")
    assert composed == [1] * MAX_EXTENDS_DEPTH  # stops at the limit: the other 1,500 files are never read
    assert p.path == "extends" and p.message == f"the chain of `extends` is longer than {MAX_EXTENDS_DEPTH} files"
    assert where(p) == (f"b{MAX_EXTENDS_DEPTH - 2}.yaml", 1, 10)


def test_chain_at_the_limit_loads(top):
    n = MAX_EXTENDS_DEPTH - 1  # the recipe and n bases
    for i in range(n):
        (top / f"b{i}.yaml").write_text(f"extends: b{i + 1}.yaml\n" if i < n - 1 else "train: {seed: 5}\n")
    (top / "r.yaml").write_text(GOOD + "extends: b0.yaml\n")
    assert load_recipe(top / "r.yaml").recipe.train.seed == 5


class _GivesUpEarly(_yaml._ShortKeyLoader):
    """A parser that stops deep nesting with its own error before emitting the level past MAX_DEPTH, as the
    libyaml in PyYAML's wheels does for 100,000 `[`: the guard must not depend on which parser that is. (Built on
    the short-key scanner so that, like libyaml, it is fast: the time asserted is the guard's.)"""

    depth = 0

    def get_event(self):
        event = super().get_event()
        self.depth += isinstance(event, _yaml.yaml.CollectionStartEvent) - isinstance(event, _yaml.yaml.CollectionEndEvent)
        if self.depth > 10:
            raise _yaml.yaml.parser.ParserError(None, None, "too deep for this parser", event.start_mark)
        return event


# Which fast parser `_yaml.parse` tries first is decided in one place (`_FAST`); every choice is forced here, so
# the depth guard is tested the same whatever PyYAML this machine has (with or without libyaml).
LOADERS = [
    pytest.param(None, id="pure-python"),
    pytest.param(getattr(_yaml.yaml, "CSafeLoader", None), id="libyaml",
                 marks=pytest.mark.skipif(not hasattr(_yaml.yaml, "CSafeLoader"), reason="PyYAML without libyaml")),
    pytest.param(_GivesUpEarly, id="gives-up-early"),
]


@pytest.fixture(params=LOADERS)
def loader(request, monkeypatch):
    from ftune.recipe import _extends

    monkeypatch.setattr(_yaml, "_FAST", request.param)
    monkeypatch.setattr(_extends, "_PARSED", {})  # parsed bases are cached by text: parse them with this parser
    return request.param


@pytest.mark.parametrize("text, at", [
    ("[" * 100_000, (1, MAX_DEPTH + 1)),
    ("a: " + "{b: " * 100_000, (1, 4 * MAX_DEPTH)),  # the top mapping is the first level
    ("".join(" " * i + "a:\n" for i in range(300)), (MAX_DEPTH + 1, MAX_DEPTH + 1)),
    ("- " * 50_000 + "x\n", (1, 2 * MAX_DEPTH + 1)),
])
def test_deep_nesting_is_a_located_error(tmp_path, text, at, loader):
    (tmp_path / "r.yaml").write_text(text)
    start = time.perf_counter()
    (p,) = problems(tmp_path / "r.yaml")
    assert time.perf_counter() - start < 1.0
    assert (p.message, where(p)) == (f"the document nests deeper than {MAX_DEPTH} levels", ("r.yaml", *at))


def test_deep_nesting_through_aliases_is_a_located_error(tmp_path, loader):
    rows = [f"a0: &a0 {'[' * 40}1{']' * 40}\n"]
    rows += [f"a{i}: &a{i} {'[' * 40}*a{i - 1}{']' * 40}\n" for i in range(1, 40)]
    (tmp_path / "r.yaml").write_text("".join(rows))
    found = problems(tmp_path / "r.yaml")
    assert [p.message for p in found] == [f"the document nests deeper than {MAX_DEPTH} levels"]


def test_deep_base_is_located_in_the_base(top, loader):
    (top / "b.yaml").write_text("train: " + "[" * 100_000)
    (top / "r.yaml").write_text(GOOD + "extends: b.yaml\n")
    (p,) = problems(top / "r.yaml")
    assert where(p) == ("b.yaml", 1, 7 + MAX_DEPTH) and "nests deeper" in p.message  # `train:` is level 1


def test_huge_base_is_refused_unparsed(top):
    (top / "b.yaml").write_text("description: " + "x" * (2 << 20) + "\n")
    (top / "r.yaml").write_text(GOOD + "extends: b.yaml\n")
    (p,) = problems(top / "r.yaml")
    assert where(p) == ("b.yaml", None, None) and p.message.endswith("b.yaml is larger than 1 MiB: not a recipe")


@pytest.mark.parametrize("fast", ["None", "_yaml.yaml.CSafeLoader"], ids=["pure-python", "libyaml"])
def test_deep_nesting_in_a_subprocess_exits_1_not_a_crash(tmp_path, fast):
    """The issue's case: 100,000 `[` segfaulted the validator (exit 139), then, with libyaml, overflowed the
    recursion limit (exit 3, "internal error"). Located, exit 1, the validation well within a second with either
    parser (timed after the imports, which a loaded machine slows most)."""
    if fast.endswith("CSafeLoader") and not hasattr(_yaml.yaml, "CSafeLoader"):
        pytest.skip("PyYAML without libyaml")
    (tmp_path / "r.yaml").write_text("[" * 100_000)
    code = (f"import sys; from ftune.recipe import _yaml; _yaml._FAST = {fast}; import time; "
            "from ftune.cli.main import main; t = time.perf_counter(); rc = main(['validate', 'r.yaml']); "
            "print(f'SECONDS {time.perf_counter() - t:.3f}'); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith(f"r.yaml:1:{MAX_DEPTH + 1}: error: the document nests deeper than {MAX_DEPTH} levels")
    assert float(proc.stdout.rsplit("SECONDS ", 1)[1]) < 1.0
