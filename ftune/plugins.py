"""Plugins: installed packages register Trainer callbacks, PEFT methods, data formats and RL rewards by name.

A package declares an entry point in the group `ftune.plugins` pointing at a `Plugin` object (data: names and
the import strings of its own code). Recipes name what a plugin registered (`train.callbacks: [{name: ...}]`,
`peft.method`, `data.train[].format`) and never an import path, so a recipe stays data. `ftune validate`
knows the installed names and suggests near matches; plugin code is imported only where it runs (callbacks
and formats in the worker, a method's light `Config` module when the schema is built).

    # pyproject.toml of a plugin package
    [project.entry-points."ftune.plugins"]
    myteam = "myteam_ftune:PLUGIN"

    # myteam_ftune/__init__.py (keep it light: no torch at import)
    PLUGIN = Plugin(callbacks={"grad-norm-log": CallbackPlugin("myteam_ftune.cb:make", args=GradNormArgs)},
                    methods={"embed-only": "myteam_ftune.embed_only"},
                    formats={"qa": FormatPlugin(fields=("question", "answer"), encode="myteam_ftune.qa:encode")})
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from ftune.errors import FtuneError

GROUP = "ftune.plugins"


@dataclass(frozen=True)
class CallbackPlugin:
    factory: str
    """'module:function' returning a transformers TrainerCallback, called with the recipe's `args`."""
    args: Any = None
    """A pydantic model class validating `args` (its errors are located in the recipe), or None for no args."""


@dataclass(frozen=True)
class FormatPlugin:
    fields: tuple[str, ...]
    """Columns every row must have."""
    encode: str
    """'module:function' called as encode(row: dict, tokenizer) -> (input_ids, labels); labels -100 = no loss."""


@dataclass(frozen=True)
class RewardPlugin:
    make: str
    """'module:function' called as make(args) -> score, where score(sample: ftune.rewards.Sample) -> float scores
    one completion (GRPO/RLOO `train.rl.rewards`)."""
    args: Any = None
    """A pydantic model class validating the reward's arguments (the keys of its entry besides name and weight)."""
    needs_answer: bool = False
    """Whether it reads the row's `answer` (then data without one is refused before training)."""


@dataclass(frozen=True)
class Plugin:
    callbacks: dict[str, CallbackPlugin] = field(default_factory=dict)
    methods: dict[str, str] = field(default_factory=dict)
    """Method name -> module with `Config` (a MethodConfig with `method: Literal[name]`) and `inject`."""
    formats: dict[str, FormatPlugin] = field(default_factory=dict)
    rewards: dict[str, RewardPlugin] = field(default_factory=dict)
    version: str = ""
    """Set by discovery: the distribution's version (part of the data cache key for formats)."""


@dataclass(frozen=True)
class Registry:
    callbacks: dict[str, CallbackPlugin]
    methods: dict[str, str]
    formats: dict[str, FormatPlugin]
    versions: dict[str, str]
    rewards: dict[str, RewardPlugin] = field(default_factory=dict)
    """Registered name -> '<distribution> <version>' that provides it."""


@cache
def installed() -> Registry:
    """Every installed plugin's registrations, merged; a name registered twice is an error naming both."""
    from importlib.metadata import entry_points

    callbacks: dict[str, CallbackPlugin] = {}
    methods: dict[str, str] = {}
    formats: dict[str, FormatPlugin] = {}
    rewards: dict[str, RewardPlugin] = {}
    versions: dict[str, str] = {}
    for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else ep.name
        try:
            plugin = ep.load()
        except Exception as err:  # noqa: BLE001 - a broken plugin is the user's to fix: say which
            raise FtuneError(f"plugin {ep.name} ({dist}) failed to load: {type(err).__name__}: {err}",
                             hint=f"fix or uninstall it (entry point {ep.value} in group {GROUP})") from None
        if not isinstance(plugin, Plugin):
            raise FtuneError(f"plugin {ep.name} ({dist}): {ep.value} is not an ftune.plugins.Plugin",
                             hint="the entry point must name a Plugin(...) object")
        for kind, table, own in (("callback", callbacks, plugin.callbacks), ("method", methods, plugin.methods),
                                 ("format", formats, plugin.formats), ("reward", rewards, plugin.rewards)):
            for name, value in own.items():
                if name in table:
                    raise FtuneError(f"{kind} '{name}' is registered by two plugins: {versions[name]} and {dist}",
                                     hint="uninstall one of them")
                table[name] = value
                versions[name] = dist
    return Registry(callbacks, methods, formats, versions, rewards)


def load_object(spec: str):
    """'module:attribute' -> the object (plugin code, imported where it runs)."""
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def make_callbacks(specs) -> list:
    """The recipe's `train.callbacks`, instantiated (worker side)."""
    out = []
    for spec in specs:
        plugin = installed().callbacks[spec.name]
        args = plugin.args.model_validate(spec.args) if plugin.args is not None else None
        factory = load_object(plugin.factory)
        out.append(factory(args) if args is not None else factory())
    return out
