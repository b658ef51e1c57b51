"""The committed JSON Schema matches the code; it carries descriptions, enums and the peft union."""

from __future__ import annotations

import json
from pathlib import Path

from ftune.recipe.export import main, render

SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "recipe.schema.json"


def test_committed_schema_is_current():
    assert SCHEMA.read_text() == render(), "schemas/recipe.schema.json is stale: run `make schemas`"


def test_schema_content():
    s = json.loads(SCHEMA.read_text())
    assert s["title"] == "ftune recipe" and s["additionalProperties"] is False
    # required keys apply to a complete recipe only (`name`, no `extends`): the `then` branch
    assert s["then"] == {"$ref": "#/$defs/RecipeComplete"}
    assert set(s["$defs"]["RecipeComplete"]["required"]) == {"name", "model", "data"}
    assert "required" not in s and "required" not in s["$defs"]["ModelSection"]
    dtype = s["$defs"]["ModelSection"]["properties"]["dtype"]
    assert dtype["else"]["enum"] == ["float32", "bfloat16", "float16", "auto"]
    assert dtype["if"] == {"$ref": "#/$defs/Interpolation"}
    assert dtype["description"].startswith("Dtype the weights are loaded in")
    peft = s["properties"]["peft"]["else"]
    assert peft["discriminator"]["propertyName"] == "method"
    assert set(peft["discriminator"]["mapping"]) == {"lora", "prefix", "llama-adapter", "full", "freeze"}
    assert {m["$ref"] for m in peft["anyOf"]} == set(peft["discriminator"]["mapping"].values())
    assert s["$defs"]["PeftLora"]["properties"]["r"]["description"].startswith("LoRA rank")
    assert s["$defs"]["PeftLora"]["additionalProperties"] is False


def test_export_writes_file(tmp_path):
    out = tmp_path / "sub" / "schema.json"
    assert main([str(out)]) == 0
    assert out.read_text() == render()
    assert main([]) == 2


def test_docs_reference_is_current():
    from ftune.recipe.export import DOCS_MARKER, docs_reference

    docs = (SCHEMA.parents[1] / "docs" / "recipes.md").read_text()
    assert DOCS_MARKER + docs.split(DOCS_MARKER)[1] == docs_reference(), (
        "docs/recipes.md key reference is stale: run `python -m ftune.recipe.export schemas/recipe.schema.json docs/recipes.md`"
    )


def test_update_docs_keeps_the_hand_written_part(tmp_path):
    from ftune.recipe.export import docs_reference, update_docs

    doc = tmp_path / "r.md"
    doc.write_text("# Recipes\n\nhand written\n")
    update_docs(doc)
    update_docs(doc)
    assert doc.read_text() == "# Recipes\n\nhand written\n\n" + docs_reference()


def test_docs_cover_every_key():
    from ftune.methods import METHODS, method_module
    from ftune.recipe._schema import _is_model, members
    from ftune.recipe.schema import Recipe

    docs = (SCHEMA.parents[1] / "docs" / "recipes.md").read_text()
    missing, todo = [], [Recipe] + [method_module(m).Config for m in METHODS]
    seen = set()
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for key, field in model.model_fields.items():
            if f"`{key}`" not in docs:
                missing.append(f"{model.__name__}.{key}")
            for m in members(field.annotation):
                inner = m.__args__[0] if getattr(m, "__origin__", None) is list else m
                if _is_model(inner):
                    todo.append(inner)
    assert not missing, f"docs/recipes.md doesn't document: {missing}"
