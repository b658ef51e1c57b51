"""PEFT methods, registered by name: one module per method, adding a method touches one place
(or an installed plugin's registration: ftune.plugins).

Each module defines a pydantic `Config` (the recipe's `peft:` section for that method, light to
import) and `inject(model, cfg, ctx) -> model`, which imports torch/peft lazily. The recipe schema
builds its `peft` union from this table, and the worker's peft stage calls `inject`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ftune.methods._base import MethodConfig
from ftune.plugins import merged

__all__ = ["BUILTIN", "DEFAULT", "METHODS", "MethodConfig", "config_classes", "method_module"]

DEFAULT = "lora"
"""The method of a `peft:` section that names none (the loader fills it in)."""

# method name (as written in recipes) -> module path. Order is the order shown in docs and errors.
BUILTIN: dict[str, str] = {
    "lora": "ftune.methods.lora",
    "prefix": "ftune.methods.prefix",
    "llama-adapter": "ftune.methods.llama_adapter",
    "full": "ftune.methods.full",
    "freeze": "ftune.methods.freeze",
}


METHODS: dict[str, str] = merged("methods", BUILTIN)
"""The built-in methods, then plugins' (a plugin can't register a built-in name: ftune.plugins.merged)."""


def method_module(name: str) -> ModuleType:
    """The module implementing method `name` (its Config and inject)."""
    return importlib.import_module(METHODS[name])


def config_classes() -> list[type]:
    return [method_module(name).Config for name in METHODS]
