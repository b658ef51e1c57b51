"""Every fenced example in README.md and docs/*.md is run here, or is marked in its page with what it needs.

A page marks a block with an HTML comment on the line before its fence (invisible on the rendered page; the block's
own text says the same to a reader):

    <!-- example: needs WHAT -->            not runnable here: a GPU, the hub, a cluster, your own files, ...
                                            (the light ftune commands in it still run when their files exist)
    <!-- example: tested-by tests/x.py::test_y -->   run by that test (which must exist)
    <!-- example: output -->                what a command prints, or a synopsis: not a command
    <!-- example: fragment [KEY=VALUE ...] -->  (yaml) part of a recipe: validated on a minimal recipe (with
                                            those keys set)
    <!-- example: config TOOL -->           (yaml, toml) another tool's file: must parse
    <!-- example: same-as PATH -->          the block is the shipped file PATH, byte for byte

Unmarked blocks are run: a `bash` block's commands must be light ftune commands (validate, show, plan,
launch-script, import) whose files exist; they run in-process from a scratch folder holding the repository's
recipes, and must exit 0; an unmarked `python` block runs there too. Figures in a command's trailing comment (`# 4,194,304 trainable`) must appear in what it
prints, as must the grouped figures of a `$ ftune ...` transcript in an untagged block. An unmarked `yaml` block
must be a recipe that validates. Anything else fails, naming the page and line to mark.
"""

from __future__ import annotations

import re
import shlex
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LIGHT = {"validate", "show", "plan", "launch-script", "import"}
KINDS = {"needs", "tested-by", "output", "fragment", "config", "same-as"}
MARK = re.compile(r"^<!-- example: (?P<kind>[a-z-]+)(?:\s+(?P<detail>.*?))?\s*-->$")
FIGURE = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?![\d,])")  # 4,194,304: a grouped figure, not a year or a step


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # the fence's line, 1-based
    lang: str
    text: str
    kind: str | None
    detail: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for page in PAGES:
        lines = page.read_text().split("\n")
        i = 0
        while i < len(lines):
            if not lines[i].startswith("```"):
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            before = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
            mark = MARK.match(before)
            found.append(Block(page, i + 1, lines[i][3:].strip(), "\n".join(lines[i + 1:end]) + "\n",
                               mark["kind"] if mark else None, (mark["detail"] or "") if mark else ""))
            i = end + 1
    return found


BLOCKS = blocks()


def commands(block: Block) -> list[tuple[list[str], str, str]]:
    """(argv, trailing comment, the transcript's printed text) of each command line in a block."""
    out, lines = [], block.text.split("\n")
    transcript = block.lang == ""
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        i += 1
        if transcript:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        while line.split("#")[0].rstrip().endswith("\\") and i < len(lines):
            code, _, comment = line.partition("  #")
            line = code.rstrip()[:-1] + " " + lines[i].strip() + (f"  #{comment}" if comment else "")
            i += 1
        code, _, comment = line.partition(" #")
        printed = ""
        if transcript:
            rest = []
            while i < len(lines) and not lines[i].startswith("$ "):
                rest.append(lines[i])
                i += 1
            printed = "\n".join(rest)
        out.append((shlex.split(code), comment, printed))
    return out


def _runnable(argv: list[str], root: Path) -> bool:
    """A light ftune command whose named files exist (flags' values and key=value overrides aside)."""
    if len(argv) < 2 or argv[0] != "ftune" or argv[1] not in LIGHT:
        return False
    paths = [a for a in argv[2:] if re.search(r"\.(ya?ml|json|toml)$", a) and "=" not in a]
    outputs = {argv[k + 1] for k, a in enumerate(argv[:-1]) if a in ("-o", "--out")}
    return all((root / p).exists() for p in paths if p not in outputs)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """A folder holding copies of the recipes and schemas: commands run here as a user's would, from the checkout's
    root, and what they write lands here."""
    root = tmp_path_factory.mktemp("docs")
    for name in ("recipes", "schemas"):
        shutil.copytree(REPO / name, root / name)
    return root


def _run(argv: list[str], root: Path, monkeypatch, capsys) -> tuple[int, str]:
    from ftune.cli.main import main

    monkeypatch.chdir(root)
    capsys.readouterr()
    code = main(argv[1:])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_every_block_is_run_or_marked():
    unmarked, bad = [], []
    for b in BLOCKS:
        if b.kind is not None:
            if b.kind not in KINDS:
                bad.append(f"{b.where}: unknown mark '{b.kind}' (one of {sorted(KINDS)})")
            elif b.kind in ("needs", "tested-by", "config", "same-as") and not b.detail:
                bad.append(f"{b.where}: '{b.kind}' needs a detail")
            continue
        if b.lang == "bash":
            cant = [" ".join(argv) for argv, _, _ in commands(b) if not _runnable(argv, REPO)]
            if cant:
                unmarked.append(f"{b.where}: not runnable here: {cant}")
        elif b.lang == "yaml":
            parsed = yaml.safe_load(b.text)
            if not (isinstance(parsed, dict) and ("extends" in parsed or {"model", "data"} <= parsed.keys())):
                unmarked.append(f"{b.where}: a yaml block that is not a whole recipe")
        elif b.lang in ("", "text", "json", "python"):
            continue  # output, synopses and transcripts (their `$ ftune` lines are checked below); python runs below  # output, synopses and transcripts; their `$ ftune` lines are checked below
        else:
            unmarked.append(f"{b.where}: a `{b.lang}` block")
    assert not bad, "\n".join(bad)
    assert not unmarked, "mark these in their pages (see this test's docstring):\n" + "\n".join(unmarked)


def test_tested_by_names_a_real_test():
    for b in (b for b in BLOCKS if b.kind == "tested-by"):
        for ref in b.detail.split():
            file, _, name = ref.partition("::")
            assert (REPO / file).is_file(), f"{b.where}: {file} does not exist"
            assert not name or re.search(rf"def {re.escape(name)}\b", (REPO / file).read_text()), \
                f"{b.where}: {ref} does not exist"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "same-as"], ids=lambda b: b.where)
def test_a_copy_of_a_shipped_file_is_the_file(block):
    assert block.text == (REPO / block.detail).read_text(), \
        f"{block.where} differs from {block.detail}: paste the file again"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "config"], ids=lambda b: b.where)
def test_another_tools_file_parses(block):
    if block.lang == "toml":
        tomllib.loads(block.text)
    else:
        assert yaml.safe_load(block.text) is not None


FRAGMENT_BASE = {"schema_version": 1, "name": "docs-example", "model": {"path": "org/model"},
                 "data": {"train": [{"path": "data.jsonl", "format": "instruction"}], "eval": {"split": 0.1}},
                 "train": {"max_steps": 10}}


def _merged(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "yaml" and b.kind in (None, "fragment")],
                         ids=lambda b: b.where)
def test_a_recipe_block_validates(block, scratch):
    from ftune.errors import RecipeError
    from ftune.recipe.load import load_recipe

    recipe = yaml.safe_load(block.text)
    if block.kind == "fragment":  # the mark may set keys of the minimal recipe: `fragment train.objective=dpo`
        base = FRAGMENT_BASE
        for item in shlex.split(block.detail):
            key, _, value = item.partition("=")
            *parents, last = key.split(".")
            over = node = {}
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = yaml.safe_load(value)
            base = _merged(base, over)
        recipe = _merged(base, recipe)
    path = scratch / "recipes" / f"_doc_{block.page.stem}_{block.line}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    try:
        load_recipe(path)
    except RecipeError as err:
        pytest.fail(f"{block.where}: the page's recipe doesn't validate:\n{err.render()}\n{yaml.safe_dump(recipe)}")


RUNNABLE = [(b, argv, comment, printed) for b in BLOCKS if b.lang in ("bash", "")
            for argv, comment, printed in commands(b) if _runnable(argv, REPO)]


@pytest.mark.parametrize("block,argv,comment,printed", RUNNABLE,
                         ids=[f"{b.where}:{' '.join(a[1:3])}" for b, a, _, _ in RUNNABLE])
def test_a_light_command_runs_as_written(block, argv, comment, printed, scratch, monkeypatch, capsys):
    code, out = _run(argv, scratch, monkeypatch, capsys)
    assert code == 0, f"{block.where}: `{' '.join(argv)}` exited {code}:\n{out[-3000:]}"
    quoted = FIGURE.findall(comment) + FIGURE.findall(printed)
    missing = [f for f in quoted if f not in out]
    assert not missing, f"{block.where}: `{' '.join(argv)}` no longer prints {missing}:\n{out[-3000:]}"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "python" and b.kind is None], ids=lambda b: b.where)
def test_a_python_block_runs(block, scratch, monkeypatch):
    monkeypatch.chdir(scratch)
    exec(compile(block.text, block.where, "exec"), {"__name__": "docs_example"})
