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


DESCRIPTION = (
    "A fine-tuning recipe for ftune. This schema checks each key on its own: unknown keys, types, allowed "
    "values and ranges. A file without `name`, or with `extends`, is a base or extends one, so its required "
    "keys may come from elsewhere and are not required here. A `${...}` interpolation is accepted in any "
    "value, and quoted numbers and yes/no strings where ftune converts them. Cross-field rules (method and "
    "quantization combinations, steps versus epochs, distributed layouts, ...) and the merged result of "
    "`extends` are checked by `ftune validate`, which is the reference."
)

# Value forms ftune accepts beyond a field's JSON type: resolved before validation, or converted by pydantic.
EXTRA_DEFS = {
    "Interpolation": {
        "type": "string",
        "pattern": r"\$\{",
        "description": "A `${...}` interpolation (another key, or `${env:VAR,default}`), resolved before validation.",
    },
    # pydantic's lax mode converts these; the schema takes them so that it never rejects what validate accepts.
    "IntegerLike": {
        "description": "Also taken as an integer by ftune: a whole number as a string, or true/false (1/0).",
        "anyOf": [{"type": "string", "pattern": r"^\s*[+-]?[0-9][0-9_]*(\.0*)?\s*$"}, {"type": "boolean"}],
    },
    "NumberLike": {
        "description": "Also taken as a number by ftune: a number as a string (e.g. 2e-4, which YAML 1.1 reads as a string), or true/false.",
        "anyOf": [
            {
                "type": "string",
                "pattern": r"^\s*([+-]?([0-9][0-9_]*\.?[0-9_]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[+-]?(inf|infinity|nan))\s*$",
            },
            {"type": "boolean"},
        ],
    },
    "BooleanLike": {
        "description": "Also taken as true/false by ftune: 0, 1, or yes/no, on/off, true/false as a string.",
        "anyOf": [
            {"enum": [0, 1]},
            {"type": "string", "pattern": r"^([Tt]rue|TRUE|[Ff]alse|FALSE|[Yy]es|YES|[Nn]o|NO|[Oo]n|ON|[Oo]ff|OFF|[tfyn01])$"},
        ],
    },
}
_LAX = {"integer": "IntegerLike", "number": "NumberLike", "boolean": "BooleanLike"}
_ANNOTATIONS = ("title", "description", "default", "examples", "deprecated")
_STRING_LIMITS = ("enum", "const", "pattern", "format", "minLength", "maxLength")


def _pydantic_schema() -> dict:
    """The pydantic JSON Schema of Recipe, with the method configs renamed `Peft<Method>`."""
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
    return schema


def _alternatives(node: dict) -> list[dict]:
    return node["anyOf"] if "anyOf" in node else [node]


def _types(node: dict, defs: dict) -> set[str]:
    """The JSON types `node` admits; a bare string type only when it admits any string ("string*")."""
    out: set[str] = set()
    for alt in _alternatives(node):
        if "$ref" in alt:
            out |= _types(defs[alt["$ref"].rsplit("/", 1)[1]], defs)
        elif "type" in alt:
            kinds = alt["type"] if isinstance(alt["type"], list) else [alt["type"]]
            if "enum" in alt or "const" in alt:  # Literal values: pydantic converts no strings to them
                kinds = [k for k in kinds if k not in _LAX]
            free = not any(k in alt for k in _STRING_LIMITS)
            out |= {f"{k}*" if k == "string" and free else k for k in kinds}
    return out


def _loosen(node: dict, defs: dict) -> dict:
    """A value position that also takes what `ftune validate` takes there: `${...}`, and strings pydantic converts."""
    kinds = _types(node, defs)
    extra = [] if "string*" in kinds else ["Interpolation"]
    extra += [name for kind, name in _LAX.items() if kind in kinds]
    if not extra:
        return node
    refs = [{"$ref": f"#/$defs/{name}"} for name in extra]
    notes = {k: v for k, v in node.items() if k in _ANNOTATIONS}
    core = {k: v for k, v in node.items() if k not in _ANNOTATIONS}
    # if/else rather than anyOf: a value that is neither is checked by the field's own schema alone, so a
    # validator reports the error at the key itself (`model.dtype: 'x' is not one of ...`).
    return {**notes, "if": refs[0] if len(refs) == 1 else {"anyOf": refs}, "else": core}


def _walk(node, defs: dict):
    """Rewrite every subschema: unions become anyOf (a section without its `method` may match several
    members, as a base's partial section does), and every value position is loosened."""
    if isinstance(node, list):
        return [_walk(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    node = {("anyOf" if k == "oneOf" else k): v for k, v in node.items()}
    out = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {k: _loosen(_walk(v, defs), defs) for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _loosen(_walk(value, defs), defs)
        elif key in ("anyOf", "allOf", "prefixItems", "else"):
            out[key] = _walk(value, defs)
        else:
            out[key] = value
    return out


def _required_overlay(node: dict, defs: dict, overlays: dict) -> dict:
    """Only the `required` keywords of `node`, along the paths that lead to them (for a complete recipe)."""
    objects, arrays = [], []
    for alt in _alternatives(node):
        if "$ref" in alt:
            name = alt["$ref"].rsplit("/", 1)[1]
            if name in EXTRA_DEFS:
                continue
            if name not in overlays:
                overlays[name] = {}  # a recursive schema ends here
                overlays[name] = _required_overlay(defs[name], defs, overlays)
            if overlays[name]:
                objects.append({"$ref": f"#/$defs/{name}{COMPLETE}"})
            continue
        if alt.get("type") == "array" and isinstance(alt.get("items"), dict):
            inner = _required_overlay(alt["items"], defs, overlays)
            if inner:
                arrays.append({"items": inner})
            continue
        own = {}
        if alt.get("required"):
            own["required"] = alt["required"]
        props = {k: o for k, v in alt.get("properties", {}).items() if (o := _required_overlay(v, defs, overlays))}
        if props:
            own["properties"] = props
        if own:
            objects.append(own)
    if len(objects) <= 1 and len(arrays) <= 1:  # object and array keywords never apply to the same value
        merged: dict = {}
        for part in objects + arrays:
            merged.update(part)
        return merged
    guarded = [{"type": "object", **o} for o in objects] + [{"type": "array", **a} for a in arrays]
    rest = [t for t, parts in (("object", objects), ("array", arrays)) if not parts]
    return {"anyOf": [*guarded, {"not": {"type": ["object", "array"]}}] + [{"type": t} for t in rest]}


COMPLETE = "Complete"


def schema_dict() -> dict:
    """The JSON Schema of a recipe: what `ftune validate` accepts key by key, for editors and CI.

    Generic over the pydantic schema: every value also takes `${...}` (and strings pydantic converts),
    unions are anyOf, and `required` applies only to a complete recipe (`name` set, no `extends`).
    """
    base = _pydantic_schema()
    defs = {**base.pop("$defs"), **EXTRA_DEFS}
    overlays: dict[str, dict] = {}
    root_overlay = _required_overlay(base, defs, overlays)
    partial = _walk(_strip_required(base), defs)
    out_defs = {name: _walk(_strip_required(d), defs) for name, d in defs.items()}
    for name, overlay in overlays.items():
        if overlay:
            out_defs[f"{name}{COMPLETE}"] = overlay
    out_defs[f"Recipe{COMPLETE}"] = root_overlay
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "ftune recipe",
        "description": DESCRIPTION,
        **{k: v for k, v in partial.items() if k not in ("title", "description")},
        # A base (no `name`) or a file that extends one may leave required keys to the other files.
        "if": {
            "required": ["name"],
            "not": {"required": ["extends"], "properties": {"extends": {"not": {"type": "null"}}}},
        },
        "then": {"$ref": f"#/$defs/Recipe{COMPLETE}"},
        "$defs": out_defs,
    }


def _strip_required(node):
    if isinstance(node, list):
        return [_strip_required(n) for n in node]
    if not isinstance(node, dict):
        return node
    return {k: _strip_required(v) for k, v in node.items() if k != "required" or not isinstance(v, list)}


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

    out = [DOCS_MARKER, "Generated from `ftune/recipe/schema/` and `ftune/methods/` by `ftune.recipe.export`.", ""]
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
        config = method_module(method).Config
        out.extend(_table(config))
        for key, field in config.model_fields.items():  # a method's nested sections (lora's `modules`)
            for m in members(field.annotation):
                if _is_model(m) and m not in seen:
                    section(m, f"peft.{key}")
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
