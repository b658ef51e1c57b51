"""Plugin rules: the callbacks a recipe names are installed, and their arguments pass the plugin's own model.

Unknown plugin formats and methods are refused by the schema itself (its choices include installed plugins').
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator

from pydantic import ValidationError

from ftune.errors import Problem
from ftune.plugins import GROUP, installed, merged
from ftune.recipe.rules import Rule
from ftune.recipe.schema import Recipe


BUILTIN_CALLBACKS: tuple[str, ...] = ()
"""ftune's own callbacks are not named in recipes; the table is here so the plugin guard covers this registry."""


def callbacks_installed(recipe: Recipe) -> Iterator[Problem]:
    known = {name: plugin for name, plugin in merged("callbacks", BUILTIN_CALLBACKS).items() if plugin is not None}
    for i, spec in enumerate(recipe.train.callbacks):
        where = f"train.callbacks.{i}"
        plugin = known.get(spec.name)
        if plugin is None:
            close = difflib.get_close_matches(spec.name, list(known), n=3)
            yield Problem.at(f"{where}.name", f"no installed plugin registers a callback named '{spec.name}'",
                             (f"did you mean {', '.join(repr(c) for c in close)}? " if close else "")
                             + (f"installed callbacks: {', '.join(sorted(known))}" if known else
                                f"no plugin in the `{GROUP}` entry-point group registers callbacks here")
                             + "; install the plugin package that provides it")
            continue
        if plugin.args is None:
            if spec.args:
                yield Problem.at(f"{where}.args", f"callback '{spec.name}' takes no arguments", "remove `args`")
            continue
        try:
            plugin.args.model_validate(spec.args)
        except ValidationError as err:
            for e in err.errors():
                key = ".".join(str(p) for p in e["loc"])
                yield Problem.at(f"{where}.args" + (f".{key}" if key else ""),
                                 f"callback '{spec.name}': {e['msg']}", f"see the {installed().versions[spec.name]} "
                                 "documentation for its arguments")


RULES: list[Rule] = [callbacks_installed]
