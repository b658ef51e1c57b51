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

from ftune.errors import FtuneError, Location

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
class ToolPlugin:
    make: str
    """'module:function' called as make(args) -> call, where call(params, row: dict) -> str runs one tool call
    (GRPO `train.rl.tools`): `params` is an instance of `params`, `row` the prompt row's columns."""
    params: Any
    """A pydantic model of the call's arguments, as the model writes them: its fields (with their docstrings) are
    the tool's signature the chat template shows, and a call whose arguments don't fit it is a tool error."""
    description: str
    """What the tool does, in one line the model reads (the tool's description in the prompt)."""
    args: Any = None
    """A pydantic model class validating the tool's recipe arguments (the keys of its entry besides name)."""


@dataclass(frozen=True)
class Plugin:
    callbacks: dict[str, CallbackPlugin] = field(default_factory=dict)
    methods: dict[str, str] = field(default_factory=dict)
    """Method name -> module with `Config` (a MethodConfig with `method: Literal[name]`) and `inject`."""
    formats: dict[str, FormatPlugin] = field(default_factory=dict)
    rewards: dict[str, RewardPlugin] = field(default_factory=dict)
    tools: dict[str, ToolPlugin] = field(default_factory=dict)
    objectives: dict[str, Any] = field(default_factory=dict)
    """Objective name -> `ftune.recipe.objectives.Objective` (its family, its config and trainer classes)."""
    version: str = ""
    """Set by discovery: the distribution's version (part of the data cache key for formats)."""


KINDS = {"callbacks": "callback", "methods": "method", "formats": "format", "rewards": "reward",
         "tools": "tool", "objectives": "objective"}
"""The registries a plugin can add to: a `Plugin` field -> the name of one entry in messages. A new registry
(rewards, ...) is a field of `Plugin` and a row here; its built-in table reaches plugins only through `merged`,
which refuses a plugin name that shadows a built-in one, so the guard comes with the registry."""


@dataclass(frozen=True)
class Registry:
    by_kind: dict[str, dict[str, Any]]
    """`KINDS` key -> registered name -> what the plugin registered."""
    versions: dict[str, str]
    """Registered name -> '<distribution> <version>' that provides it."""

    @property
    def callbacks(self) -> dict[str, CallbackPlugin]:
        return self.by_kind["callbacks"]

    @property
    def methods(self) -> dict[str, str]:
        return self.by_kind["methods"]

    @property
    def formats(self) -> dict[str, FormatPlugin]:
        return self.by_kind["formats"]

    @property
    def rewards(self) -> dict[str, RewardPlugin]:
        return self.by_kind["rewards"]

    @property
    def tools(self) -> dict[str, ToolPlugin]:
        return self.by_kind["tools"]

    @property
    def objectives(self) -> dict[str, Any]:
        return self.by_kind["objectives"]


class PluginError(FtuneError):
    """A plugin that failed to load or registers a name it can't have; names the distribution and entry point."""


def _located(ep) -> Location:
    """Where an entry point's code is: the module file it names (when it can be found without importing it)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(ep.value.partition(":")[0].strip())
    except (ImportError, ValueError, AttributeError):
        spec = None
    origin = getattr(spec, "origin", None)
    return Location(file=origin) if origin and origin not in ("built-in", "frozen") else Location(origin="plugin")


def _load(ep, dist: str):
    """The entry point's object, guarded: plugin code that raises anything, `sys.exit()` included, is a located
    error naming it (exit 1) and never ends ftune with the plugin's own exit status."""
    try:
        return ep.load()
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # noqa: BLE001 - SystemExit too: a plugin can't fake a pass (exit 0) or a failure
        what = f"called sys.exit({err.code!r})" if isinstance(err, SystemExit) else f"{type(err).__name__}: {err}"
        raise PluginError(f"plugin entry point {ep.name} = {ep.value} ({dist}) failed to load: {what}",
                          hint=f"fix or uninstall {dist.split()[0]} (entry point {ep.name} in group {GROUP})",
                          location=_located(ep)) from None


@cache
def installed() -> Registry:
    """Every installed plugin's registrations, merged; a name registered twice is an error naming both."""
    from importlib.metadata import entry_points

    by_kind: dict[str, dict[str, Any]] = {kind: {} for kind in KINDS}
    versions: dict[str, str] = {}
    for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else ep.name
        plugin = _load(ep, dist)
        if not isinstance(plugin, Plugin):
            raise PluginError(f"plugin entry point {ep.name} = {ep.value} ({dist}) is not an ftune.plugins.Plugin",
                              hint="the entry point must name a Plugin(...) object", location=_located(ep))
        for kind, one in KINDS.items():
            own = getattr(plugin, kind)
            if not isinstance(own, dict) or not all(isinstance(k, str) for k in own):
                raise PluginError(f"plugin entry point {ep.name} ({dist}): Plugin.{kind} is not a dict of names",
                                  location=_located(ep))
            for name, value in own.items():
                if name in versions:
                    raise PluginError(f"{one} '{name}' is registered by two plugins: {versions[name]} and {dist}",
                                      hint="uninstall one of them", location=_located(ep))
                by_kind[kind][name] = value
                versions[name] = dist
    return Registry(by_kind, versions)


def merged(kind: str, builtin: dict[str, Any] | tuple[str, ...] | list[str]) -> dict[str, Any]:
    """A registry: its built-in entries, then the installed plugins' entries of `kind` (a `KINDS` key). A plugin
    name that is built in is refused (naming the plugin), never silently shadowing the built-in."""
    registry = installed()
    plugged = registry.by_kind[kind]
    table = dict(builtin) if isinstance(builtin, dict) else {name: None for name in builtin}
    taken = sorted(set(plugged) & set(table))
    if taken:
        raise PluginError(f"plugin {registry.versions[taken[0]]} registers {KINDS[kind]} '{taken[0]}', which is "
                          "built in", hint=f"rename the plugin's {KINDS[kind]}; built-in {kind}: {', '.join(table)}")
    return {**table, **plugged}


def load_object(spec: str):
    """'module:attribute' -> the object (plugin code, imported where it runs; a `sys.exit` in it is an error)."""
    module, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # noqa: BLE001
        what = f"called sys.exit({err.code!r})" if isinstance(err, SystemExit) else f"{type(err).__name__}: {err}"
        raise PluginError(f"plugin code {spec} failed to load: {what}", hint="fix or uninstall the plugin") from None


def make_callbacks(specs) -> list:
    """The recipe's `train.callbacks`, instantiated (worker side)."""
    out = []
    for spec in specs:
        plugin = installed().callbacks[spec.name]
        args = plugin.args.model_validate(spec.args) if plugin.args is not None else None
        factory = load_object(plugin.factory)
        out.append(factory(args) if args is not None else factory())
    return out
