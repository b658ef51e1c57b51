"""PEFT methods, registered by name: one module per method, adding a method touches one place.

Each module defines a pydantic `Config` (the recipe's `peft:` section for that method, light to
import) and `inject(model, cfg, ctx) -> model`, which imports torch/peft lazily. The recipe schema
builds its `peft` union from this table, and the worker's peft stage calls `inject`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# method name (as written in recipes) -> module path. Order is the order shown in docs and errors.
METHODS: dict[str, str] = {
    "lora": "ftune.methods.lora",
    "prefix": "ftune.methods.prefix",
    "llama-adapter": "ftune.methods.llama_adapter",
    "full": "ftune.methods.full",
    "freeze": "ftune.methods.freeze",
}


def method_module(name: str) -> ModuleType:
    """The module implementing method `name` (its Config and inject)."""
    return importlib.import_module(METHODS[name])


def config_classes() -> list[type]:
    return [method_module(name).Config for name in METHODS]
