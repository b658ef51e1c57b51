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
    assert set(s["required"]) == {"name", "model", "data"}
    dtype = s["$defs"]["ModelSection"]["properties"]["dtype"]
    assert dtype["enum"] == ["float32", "bfloat16", "float16", "auto"]
    assert dtype["description"].startswith("Dtype the weights are loaded in")
    peft = s["properties"]["peft"]
    assert peft["discriminator"]["propertyName"] == "method"
    assert set(peft["discriminator"]["mapping"]) == {"lora", "prefix", "llama-adapter", "full", "freeze"}
    assert s["$defs"]["PeftLora"]["properties"]["r"]["description"].startswith("LoRA rank")
    assert s["$defs"]["PeftLora"]["additionalProperties"] is False


def test_export_writes_file(tmp_path):
    out = tmp_path / "sub" / "schema.json"
    assert main([str(out)]) == 0
    assert out.read_text() == render()
    assert main([]) == 2
