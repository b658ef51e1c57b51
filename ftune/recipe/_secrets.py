"""Secrets: values that never land in a file or a message, and never in a path.

A secret is a value read from an environment variable with a secret name (`${env:HF_TOKEN}`), or any
value at a secret-named key (`model.hub_token`) however it was given: an override on the command line,
the recipe text, another variable. Each is replaced by MASK in the Recipe, hence in recipe.resolved.yaml,
plan.json and `ftune show`; `secrets` records, per dotted path, the environment variable the worker
reads the real value from (`Plan.secret`). A value with no variable of its own (an override, a literal)
gets a generated one, FTUNE_SECRET_<PATH>: `env` maps it to the value, and the launcher sets it in the
workers' environment only. A secret inside a path (a run dir named after a token) is an error at the key.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ftune.errors import Problem
from ftune.recipe._interp import _ENV_REF, MASK, KeyPath, _dotted, _set, is_secret_name, leaves

SECRET_WORDS = frozenset({"token", "key", "apikey", "secret", "password", "passwd", "pass", "passphrase",
                          "credential", "credentials", "auth"})
"""Words that make a key secret: `hub_token`, `api_key`, `apiKey`; not `tokenizer` or `num_virtual_tokens`."""
PATH_KEYS = ("name", "model.path", "model.tokenizer", "data.cache_dir", "data.train.*.path", "data.eval.*.path",
             "distributed.accelerate_config", "distributed.deepspeed.config", "checkpoint.resume", "output.dir")
"""Values that become paths (`name` names the default run dir): they show in listings, logs and plan.json."""
ENV_PREFIX = "FTUNE_SECRET_"
NOT_SECRET = ("model.special_tokens",)
"""Sections whose `*_token` keys name vocabulary tokens (`eos_token: <|im_end|>`), not credentials."""


def is_secret_key(name: object) -> bool:
    """Whether a recipe key holds a secret, by its words (environment variables use `is_secret_name`)."""
    if not isinstance(name, str):
        return False
    words = re.findall(r"[a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower())
    return any(w in SECRET_WORDS for w in words)


def is_secret_path(path: KeyPath) -> bool:
    """Whether the value at `path` is a secret: its last key's words say so, outside NOT_SECRET sections."""
    dotted = ".".join(str(p) for p in path)
    return bool(path) and is_secret_key(path[-1]) and not any(dotted.startswith(f"{s}.") for s in NOT_SECRET)


def is_path_key(path: KeyPath) -> bool:
    return any(
        len(p) == len(path) and all(a == "*" or a == str(b) for a, b in zip(p, path))
        for p in (k.split(".") for k in PATH_KEYS)
    )


def env_name(path: KeyPath) -> str:
    """The generated variable for the secret at `path`: model.hub_token → FTUNE_SECRET_MODEL_HUB_TOKEN."""
    return ENV_PREFIX + re.sub(r"[^A-Z0-9]+", "_", _dotted(path).upper()).strip("_")


def shown_override(arg: str) -> str:
    """An override as messages and `ftune show` quote it: the value of a secret key masked."""
    key, eq, _ = arg.partition("=")
    parts = key.lstrip("~").split(".")
    secret = any(is_secret_key(p) for p in parts) and not any(key.lstrip("~").startswith(f"{s}.") for s in NOT_SECRET)
    return f"{key}={MASK}" if eq and secret else arg


def override_secrets(args: list[str] | tuple[str, ...]) -> set[str]:
    """The values given to secret keys on the command line, also ones a later override replaced."""
    return {arg.partition("=")[2] for arg in args if shown_override(arg) != arg and arg.partition("=")[2]}


@dataclass
class Masked:
    secrets: dict[str, str] = field(default_factory=dict)
    """Dotted path → environment variable holding the masked value."""
    env: dict[str, str] = field(default_factory=dict, repr=False)
    """Generated variable → secret value, for the workers' environment (never written to disk)."""
    issues: list[Problem] = field(default_factory=list)
    values: set[str] = field(default_factory=set, repr=False)
    """Every secret value found: no message may quote one."""

    def scrub(self, text: str | None) -> str | None:
        if text is None:
            return None
        for value in sorted(self.values, key=len, reverse=True):
            if len(value) >= 4:  # a shorter "secret" would mangle every word; quoted overrides are masked by key
                text = text.replace(value, MASK)
        return text


def mask_secrets(raw: dict, out: dict) -> Masked:
    """Mask every secret in `out` (the interpolated `raw`) in place; the paths → variables, and the issues.

    A secret inside a longer string masks the whole string: the worker can only restore whole values
    (`Plan.secret`), so write `hub_token: ${env:HF_TOKEN}` where the value is needed.
    """
    refs = {path: value for path, value in leaves(raw) if isinstance(value, str) and "${" in value}
    own = {path: _ENV_REF.findall(value) for path, value in refs.items()}  # the variables each value names itself
    holders: dict[str, str] = {}  # secret value → a variable that holds it
    for names in own.values():
        for name in names:
            if is_secret_name(name) and os.environ.get(name):
                holders[os.environ[name]] = name
    masked = Masked()
    for path, value in list(leaves(out)):
        if is_secret_path(path) and isinstance(value, str) and value and value != MASK:
            named = [n for n in own.get(path, ()) if os.environ.get(n) == value]
            if named:
                holders.setdefault(value, named[0])
            elif value not in holders:
                holders[value] = env_name(path)
                masked.env[holders[value]] = value
    masked.values = set(holders)
    if not holders:
        return masked
    for path, value in list(leaves(out)):
        if not isinstance(value, str) or not any(secret in value for secret in holders):
            continue
        if is_path_key(path):
            masked.issues.append(Problem.at(
                path,
                "a secret can't be part of a path (it would show in file listings, logs and plan.json)",
                "secrets belong in secret keys such as model.hub_token; build the path without it", anchor="value"))
            _set(out, path, None)
            continue
        _set(out, path, MASK)
        named = [n for n in own.get(path, ()) if os.environ.get(n) == value]
        masked.secrets[_dotted(path)] = named[0] if named else holders.get(value) or next(
            n for s, n in holders.items() if s in value)
    return masked
