"""Write the recipe JSON Schema for editors: `python -m ftune.recipe.export schemas/recipe.schema.json`.

Generated from the pydantic schema (descriptions are the field docs, enums from Literal types, the
`peft` section a union discriminated by `method`). The file is committed; a test fails when it drifts.
"""

from __future__ import annotations

import json
import sys
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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m ftune.recipe.export OUTPUT.json", file=sys.stderr)
        return 2
    out = Path(args[0])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render())
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
