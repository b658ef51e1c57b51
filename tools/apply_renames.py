"""Rewrite imports and module paths by tools/renames.txt (issue #44's rooms), in the files given.

    python tools/apply_renames.py FILE...            rewrite in place, print the files changed
    python tools/apply_renames.py --check FILE...    print what would change, exit 1 if anything would

renames.txt holds one rename a line, old then new; `#` starts a comment:
- `old.dotted.module new.dotted.module`: a module or package moved (`ftune.moe ftune.models.moe`). Rewrites dotted
  names (`ftune.moe`, `ftune.moe.count`, `"ftune.moe:x"`), slash paths (`ftune/moe.py`, `ftune/dataset/`), and
  `from PARENT import NAME` where PARENT.NAME is the old module (`from ftune import moe` ->
  `from ftune.models import moe`), splitting an import whose other names stay.
- `old.module:Name new.module:Name`: a public name moved between modules (applied after the module moves, so
  `old.module` is the name's module once they are applied): `from old.module import Name, Other` is split.

Longest names first, so a package move and a module move inside it compose. The merger runs it over the files
another branch added or changed after merging that branch (docs and tests included).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

TABLE = Path(__file__).resolve().parent / "renames.txt"


def read_table(path: Path = TABLE) -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
    """(module moves, name moves as (old module, new module, name)), module moves longest first."""
    modules, names = [], []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        old, new = line.split()
        if ":" in old:
            (om, on), (nm, nn) = old.split(":"), new.split(":")
            assert on == nn, f"a moved name keeps its name: {line}"
            names.append((om, nm, on))
        else:
            modules.append((old, new))
    modules.sort(key=lambda m: -len(m[0]))
    return modules, names


_FROM = re.compile(r"^(?P<indent>[ \t]*)from (?P<mod>[\w.]+) import (?P<body>\((?:[^()#]|#[^\n]*)*\)|[^\n#]*?)"
                   r"(?P<tail>[ \t]*(#[^\n]*)?)$", re.M)


def _split_names(body: str) -> list[str]:
    body = body.strip()
    if body.startswith("("):
        body = body[1:-1]
    body = re.sub(r"#[^\n]*", "", body)
    return [n.strip() for n in body.replace("\n", " ").split(",") if n.strip()]


def _import_line(indent: str, mod: str, names: list[str], width: int = 120) -> str:
    line = f"{indent}from {mod} import {', '.join(names)}"
    if len(line) <= width:
        return line
    out, current = [f"{indent}from {mod} import ("], f"{indent}    "
    for name in names:
        piece = f"{name}, "
        if len(current) + len(piece) > width and current.strip():
            out.append(current.rstrip())
            current = f"{indent}    "
        current += piece
    out.append(current.rstrip().rstrip(",") + ",")
    out.append(f"{indent})")
    return "\n".join(out)


def _rewrite_from(text: str, moved: dict[tuple[str, str], tuple[str, str]]) -> str:
    """`from MOD import a, b`: each name whose (MOD, name) moved goes to its new module (under its new name, bound
    to the old one: `from ftune.plan import plan as model`); the rest stays."""

    def fix(m: re.Match) -> str:
        mod, names = m["mod"], _split_names(m["body"])
        if not any((mod, n.split(" as ")[0].strip()) in moved for n in names):
            return m.group(0)
        groups: dict[str, list[str]] = {}
        for n in names:
            name, _, alias = (part.strip() for part in n.partition(" as "))
            target, new_name = moved.get((mod, name), (mod, name))
            bound = alias or name
            groups.setdefault(target, []).append(new_name if new_name == bound else f"{new_name} as {bound}")
        lines = [_import_line(m["indent"], target, ns) for target, ns in groups.items()]
        return "\n".join(lines) + (m["tail"] or "")

    return _FROM.sub(fix, text)


def rewrite(text: str, modules: list[tuple[str, str]], names: list[tuple[str, str, str]]) -> str:
    # `from ftune import moe` / `from ftune.estimate import catalog`: the submodule imported by its parent
    by_parent = {}
    for old, new in modules:
        parent, _, leaf = old.rpartition(".")
        new_parent, _, new_leaf = new.rpartition(".")
        if parent and new_parent:
            by_parent[(parent, leaf)] = (new_parent, new_leaf)
    text = _rewrite_from(text, by_parent)
    # dotted names and slash paths, one pass (longest first), so a rewritten name is never rewritten again
    table = {}
    for old, new in modules:
        table[old] = new
        table[old.replace(".", "/")] = new.replace(".", "/")
    pattern = re.compile(r"(?<![\w./-])(" + "|".join(re.escape(k) for k in sorted(table, key=len, reverse=True))
                         + r")(?![\w])")
    if table:
        text = pattern.sub(lambda m: table[m.group(1)], text)
    # public names moved between modules
    text = _rewrite_from(text, {(om, n): (nm, n) for om, nm, n in names})
    for om, nm, n in names:  # dotted references to the name (docs, strings): old.module.Name
        text = re.sub(r"(?<![\w.])" + re.escape(f"{om}.{n}") + r"(?![\w])", f"{nm}.{n}", text)
    return text


def main(argv: list[str]) -> int:
    check = "--check" in argv
    files = [Path(a) for a in argv if a != "--check"]
    modules, names = read_table()
    changed = []
    for file in files:
        if not file.is_file():
            continue
        try:
            text = file.read_text()
        except UnicodeDecodeError:
            continue
        new = rewrite(text, modules, names)
        if new != text:
            changed.append(str(file))
            if not check:
                file.write_text(new)
    print("\n".join(changed))
    return 1 if check and changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
