"""Write the recipe JSON Schema for editors, and the key reference of docs/recipes.md.

    python -m ftune.recipe.export schemas/recipe.schema.json [docs/recipes.md]

Both come from the pydantic schema (descriptions are the field docs, enums from Literal types, the
`peft` section a union discriminated by `method`). Both files are committed; tests fail when they drift.
"""

from __future__ import annotations

import json
import sys
import typing
from pathlib import Path

from ftune.methods import METHODS

SCHEMA_ID = "https://ftune.dev/schemas/recipe.schema.json"


def _method_def_name(module: str) -> str:
    method = next(name for name, mod in METHODS.items() if mod == module)
    return "Peft" + "".join(part.capitalize() for part in method.split("-"))


def schema_dict() -> dict:
    """The JSON Schema of a recipe, with readable definition names."""
    from ftune.recipe.schema import Recipe

    schema = Recipe.model_json_schema(mode="validation")
    renames = {}
    for name in list(schema.get("$defs", {})):
        if name.startswith("ftune__methods__") and name.endswith("__Config"):
            module = "ftune.methods." + name.removeprefix("ftune__methods__").removesuffix("__Config")
            renames[name] = _method_def_name(module)
    text = json.dumps(schema)
    for old, new in renames.items():
        text = text.replace(f'"#/$defs/{old}"', f'"#/$defs/{new}"')
    schema = json.loads(text)
    schema["$defs"] = {renames.get(k, k): v for k, v in schema["$defs"].items()}
    for method, module in METHODS.items():
        schema["$defs"][_method_def_name(module)]["title"] = f"peft: {method}"
    schema["properties"]["peft"]["default"] = {"method": next(iter(METHODS))}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "ftune recipe",
        **{k: v for k, v in schema.items() if k != "title"},
    }


def render() -> str:
    return json.dumps(schema_dict(), indent=2, ensure_ascii=False) + "\n"


# ------------------------------------------------------------------------------ docs reference
DOCS_MARKER = "## Reference: every section and key\n"
SECTIONS = ("model", "data", "quantization", "distributed", "train", "eval", "checkpoint", "output")
TITLES = {
    "data.train": "`data.train` (each source; `data.eval` as a list takes the same keys)",
    "data.eval": "`data.eval` as a held-out split",
}


def _default(field) -> str:
    if field.is_required():
        return "**required**"
    if field.default_factory is not None:
        value = field.default_factory()
        return "(section defaults)" if hasattr(value, "model_dump") else f"`{value}`"
    value = field.default
    if value is None:
        return "null"
    return f"`{str(value).lower()}`" if isinstance(value, bool) else f"`{value}`"


def _table(model) -> list[str]:
    from ftune.recipe._schema import members

    rows = ["| key | default | meaning |", "|---|---|---|"]
    for key, field in model.model_fields.items():
        allowed = [str(a) for m in members(field.annotation) if typing.get_origin(m) is typing.Literal
                   for a in typing.get_args(m)]
        text = (field.description or "").replace("|", "\\|").replace("\n", " ")
        if allowed and len(allowed) <= 12:
            text += " One of: " + ", ".join(f"`{a}`" for a in allowed) + "."
        rows.append(f"| `{key}` | {_default(field)} | {text} |")
    return rows


def docs_reference() -> str:
    """The key tables of docs/recipes.md: the top level, each section (nested ones too), each method."""
    from ftune.recipe._schema import _is_model, members
    from ftune.recipe.schema import Recipe

    out = [DOCS_MARKER, "Generated from `ftune/recipe/schema.py` and `ftune/methods/` by `ftune.recipe.export`.", ""]
    out += _table(Recipe)
    seen: set[type] = set()

    def section(model, title: str) -> None:
        seen.add(model)
        out.extend(["", f"### {TITLES.get(title, f'`{title}`')}", ""])
        out.extend(_table(model))
        for key, field in model.model_fields.items():
            for m in members(field.annotation):
                inner = typing.get_args(m)[0] if typing.get_origin(m) is list else m
                if _is_model(inner) and inner not in seen:
                    section(inner, f"{title}.{key}")

    for name in SECTIONS:
        model = next(m for m in members(Recipe.model_fields[name].annotation) if _is_model(m))
        section(model, name)
    for method, module in METHODS.items():
        from ftune.methods import method_module

        out.extend(["", f"### `peft` with `method: {method}`", ""])
        out.extend(_table(method_module(method).Config))
    return "\n".join(out) + "\n"


def update_docs(path: Path) -> None:
    text = path.read_text()
    head = text.split(DOCS_MARKER)[0] if DOCS_MARKER in text else text.rstrip("\n") + "\n\n"
    path.write_text(head + docs_reference())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2):
        print("usage: python -m ftune.recipe.export OUTPUT.json [DOCS.md]", file=sys.stderr)
        return 2
    out = Path(args[0])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render())
    print(f"wrote {out}")
    if len(args) == 2:
        update_docs(Path(args[1]))
        print(f"updated the key reference in {args[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
