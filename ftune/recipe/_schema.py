"""Schema knowledge for messages: pydantic errors as the user's paths, did-you-mean, ranges.

pydantic reports locations through its own structure (`peft.lora.rnak`, `data.eval.EvalSplit`);
users wrote `peft.rnak` and `data.eval`. This module walks the Recipe's types alongside a location
to recover the user's path, the field, its documentation and its constraints.
"""

from __future__ import annotations

import difflib
import types
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from ftune.errors import Problem, key_path
from ftune.methods import METHODS, method_module
from ftune.recipe.schema import Recipe

Path = tuple[str | int, ...]


# Names other tools use for our keys; a typo of one still finds ours (`rnak` → rank → r).
ALIASES = {
    "rank": "r",
    "lora_r": "r",
    "lora_alpha": "alpha",
    "lora_dropout": "dropout",
    "lr": "learning_rate",
    "batch_size": "per_device_batch_size",
    "micro_batch_size": "per_device_batch_size",
    "per_device_train_batch_size": "per_device_batch_size",
    "num_epochs": "epochs",
    "num_train_epochs": "epochs",
    "grad_accum": "gradient_accumulation_steps",
    "gradient_accumulation": "gradient_accumulation_steps",
    "scheduler": "lr_scheduler",
    "lr_scheduler_type": "lr_scheduler",
    "sequence_len": "max_seq_length",
    "seq_len": "max_seq_length",
    "max_length": "max_seq_length",
    "cutoff_len": "max_seq_length",
    "torch_dtype": "dtype",
    "model_name_or_path": "path",
    "base_model": "path",
    "output_dir": "dir",
    "warmup": "warmup_ratio",
    "optim": "optimizer",
    "target": "target_modules",
    "save_steps": "steps",
    "save_total_limit": "keep",
    "eval_steps": "steps",
    "type": "method",
}


def did_you_mean(word: str, choices: list[str] | tuple[str, ...]) -> str | None:
    """The closest choice to a misspelled word, also through common aliases; None if nothing is close."""
    names = [str(c) for c in choices]
    pool = names + [a for a, target in ALIASES.items() if target in names and a not in names]
    match = difflib.get_close_matches(str(word), pool, n=1, cutoff=0.6)
    if not match:
        return None
    return match[0] if match[0] in names else ALIASES[match[0]]


def method_configs() -> dict[str, type[BaseModel]]:
    return {name: method_module(name).Config for name in METHODS}


def show(value: Any) -> str:
    """A value as the user would recognise it in YAML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value) if isinstance(value, str) else str(value)


def _unwrap(tp: Any) -> Any:
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def members(tp: Any) -> list[Any]:
    """The non-None alternatives of a (possibly optional) union, else [tp]."""
    tp = _unwrap(tp)
    if get_origin(tp) in (Union, types.UnionType):
        return [_unwrap(a) for a in get_args(tp) if a is not type(None)]
    return [tp]


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _tag_of(tp: Any) -> str:
    if _is_model(tp):
        method = tp.model_fields.get("method")
        return str(method.default) if method is not None else tp.__name__
    origin = get_origin(tp)
    if origin is Literal:
        return "literal["
    if origin is not None:
        return f"{origin.__name__}["
    return getattr(tp, "__name__", str(tp))


def _pick(alternatives: list[Any], tag: str) -> Any:
    for alt in alternatives:
        name = _tag_of(alt)
        if tag == name or (name.endswith("[") and tag.startswith(name)):
            return alt
    return Any


@dataclass
class _Step:
    path: list[str | int]
    parent: type[BaseModel] | None = None
    field: FieldInfo | None = None
    union_at: Path | None = None


def walk_loc(loc: tuple) -> _Step:
    """Follow a pydantic error location through the Recipe's types, dropping union member tags."""
    step = _Step(path=[])
    tp: Any = Recipe
    i = 0
    while i < len(loc):
        alternatives = members(tp)
        if len(alternatives) > 1:  # pydantic inserted a member tag (a discriminator value or a type name)
            step.union_at = tuple(step.path)
            tp = _pick(alternatives, str(loc[i]))
            i += 1
            continue
        tp, el = alternatives[0], loc[i]
        step.path.append(el)
        if _is_model(tp):
            step.parent, step.field = tp, tp.model_fields.get(str(el))
            tp = step.field.annotation if step.field else Any
        elif get_origin(tp) in (list, dict):
            tp = get_args(tp)[-1]
        else:
            tp = Any
        i += 1
    return step


def range_text(field: FieldInfo | None, name: str) -> str | None:
    """`0 <= dropout < 1` from the field's constraints, or None."""
    if field is None:
        return None
    low = high = None
    for m in field.metadata:
        if getattr(m, "gt", None) is not None:
            low = f"{m.gt} < "
        if getattr(m, "ge", None) is not None:
            low = f"{m.ge} <= "
        if getattr(m, "lt", None) is not None:
            high = f" < {m.lt}"
        if getattr(m, "le", None) is not None:
            high = f" <= {m.le}"
    if low is None and high is None:
        return None
    if low and not high:
        op, num = low.strip().split(" ")[1], low.strip().split(" ")[0]
        return f"{name} {'>' if op == '<' else '>='} {num}"
    return f"{low or ''}{name}{high or ''}"


_EXPECTED = {
    "string_type": "a string",
    "list_type": "a list",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "model_type": "a mapping of keys",
    "model_attributes_type": "a mapping of keys",
    "dict_type": "a mapping of keys",
}
_RANGE = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


# What YAML 1.1 (PyYAML's safe loader) reads as a boolean when unquoted, in lower, Title or UPPER case.
_YAML_BOOLEANS = {True: ("yes", "on", "true"), False: ("no", "off", "false")}


def _as_boolean(value: bool, allowed: list[str] | None = None) -> tuple[str, str]:
    """(what to add to the message, the word to quote) for a boolean where a string is wanted: the allowed value
    YAML turned into this boolean when there is one (`no` -> false), else the usual word."""
    word = next((a for a in allowed or [] if a.lower() in _YAML_BOOLEANS[value]), _YAML_BOOLEANS[value][0])
    yes, on, true = _YAML_BOOLEANS[value]
    return f"an unquoted {yes}, {on} or {true} is read as the boolean {show(value)}", word


def _dotted(path) -> str:
    """A path as an override names it (`eval.strategy`, `data.train.0.format`)."""
    return ".".join(map(str, path))


def _describe(step: _Step) -> str | None:
    if step.field is None or not step.field.description:
        return None
    return f"{step.path[-1]}: {step.field.description}"


def _expected(err: dict) -> str:
    if err["type"] == "literal_error":
        expected = err["ctx"]["expected"]
        return "one of " + expected.replace(" or ", ", ") if "," in expected or " or " in expected else expected
    return _EXPECTED.get(err["type"], err["msg"][0].lower() + err["msg"][1:])


def _literal_values(err: dict) -> list[str]:
    return [a.strip().strip("'") for a in err["ctx"]["expected"].replace(" or ", ", ").split(",")]


def _unknown_key(step: _Step, key: str) -> Problem:
    parent_path = ".".join(map(str, step.path[:-1]))
    allowed = [k for k in step.parent.model_fields] if step.parent else []
    guess = did_you_mean(key, allowed)
    message = "unknown key" + (f" (did you mean '{guess}'?)" if guess else "")
    where = f"under `{parent_path}`" if parent_path else "at the top level"
    hint = f"allowed keys {where}: {', '.join(allowed)}"
    if step.path[:1] == ["peft"] and len(step.path) == 2:
        owners = [m for m, cfg in method_configs().items() if key in cfg.model_fields]
        if owners:
            hint = f"'{key}' belongs to peft.method {' / '.join(owners)}; {hint}"
    return Problem.at(tuple(step.path), message, hint, "key")


def translate(errors: list[dict]) -> list[Problem]:
    """pydantic errors → issues on the user's paths, union alternatives merged into one message."""
    issues: list[Problem] = []
    unions: dict[Path, list[tuple[dict, _Step]]] = {}
    matched: set[Path] = set()  # unions where an alternative took the value's type: its errors say more
    for err in errors:
        step = walk_loc(err["loc"])
        if step.union_at is not None and tuple(step.path) == step.union_at and err["type"] in (_EXPECTED.keys() | {"literal_error"}):
            unions.setdefault(step.union_at, []).append((err, step))
            continue
        issues.append(_one(err, step))
        if step.union_at is not None:
            matched.add(tuple(step.path[: len(step.union_at)]))
    paths = [key_path(i.path) for i in issues]
    deeper = {p[: len(u)] for p in paths for u in unions if len(p) > len(u)} | matched
    for at, alts in unions.items():
        if at in deeper:  # one alternative matched the shape; its own errors say more
            continue
        err, step = alts[0]
        wanted = " or ".join(dict.fromkeys(_expected(e) for e, _ in alts))
        value, hint = err["input"], _describe(step)
        message = f"expected {wanted}, got {show(value)}"
        kinds = {e["type"] for e, _ in alts}
        if isinstance(value, bool) and kinds & {"string_type", "literal_error"}:
            allowed = [a for e, _ in alts if e["type"] == "literal_error" for a in _literal_values(e)]
            read, word = _as_boolean(value, allowed)
            message = f"{message}: {read}"
            if "string_type" in kinds or word in allowed:
                hint = (f"quote it: '{word}', in an override too: \"{_dotted(at)}='{word}'\"" if word in allowed
                        else f"quote it, e.g. '{word}'")
        issues.append(Problem.at(at, message, hint, anchor="value"))
    return issues


def _one(err: dict, step: _Step) -> Problem:
    kind, path, value = err["type"], tuple(step.path), err.get("input")
    name = str(path[-1]) if path else "recipe"
    if kind == "extra_forbidden":
        return _unknown_key(step, str(path[-1]))
    if kind == "missing":
        return Problem.at(path, "required key is missing", _describe(step), "parent")
    if kind == "union_tag_invalid":
        tags = list(METHODS)
        guess = did_you_mean(err["ctx"]["tag"], tags)
        message = f"unknown method {show(err['ctx']['tag'])}" + (f" (did you mean '{guess}'?)" if guess else "")
        return Problem.at((*path, "method"), message, f"methods: {', '.join(tags)}", anchor="value")
    if kind == "literal_error":
        allowed = _literal_values(err)
        hint = f"allowed values: {', '.join(allowed)}"
        if isinstance(value, bool):
            read, word = _as_boolean(value, allowed)
            if word in allowed:  # `mixed_precision: no`: the user wrote an allowed value, YAML changed it
                return Problem.at(path, f"invalid value {show(value)}: {read}",
                             f"quote it: '{word}', in an override too: \"{_dotted(path)}='{word}'\" ({hint})", anchor="value")
            return Problem.at(path, f"invalid value {show(value)}: {read}", hint, anchor="value")
        guess = did_you_mean(str(value), allowed) if isinstance(value, str) else None
        message = f"invalid value {show(value)}" + (f" (did you mean '{guess}'?)" if guess else "")
        return Problem.at(path, message, hint, anchor="value")
    if kind in _RANGE:
        ops = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
        ctx = err.get("ctx", {})
        bound = range_text(step.field, name) or " and ".join(f"{name} {ops[k]} {v}" for k, v in ctx.items() if k in ops)
        return Problem.at(path, f"{show(value)} is out of range", f"allowed range: {bound}", anchor="value")
    if kind == "finite_number":
        bound = range_text(step.field, name)
        return Problem.at(path, f"{show(value)} is not a finite number", f"allowed range: {bound}" if bound else _describe(step), anchor="value")
    if kind in ("too_short", "too_long"):
        ctx = err.get("ctx", {})
        bound = ctx.get("min_length") if kind == "too_short" else ctx.get("max_length")
        size = "at least" if kind == "too_short" else "at most"
        return Problem.at(path, f"needs {size} {bound} item{'s' if bound != 1 else ''}, got {ctx.get('actual_length')}", _describe(step), anchor="value")
    if kind == "string_pattern_mismatch":
        return Problem.at(path, f"invalid value {show(value)}", _describe(step), anchor="value")
    if kind in _EXPECTED:
        hint = _describe(step)
        if kind == "list_type" and isinstance(value, str):
            hint = f"write a list: [{value}]"
        elif kind == "string_type" and isinstance(value, bool):
            read, word = _as_boolean(value)
            return Problem.at(path, f"expected {_EXPECTED[kind]}, got {show(value)}: {read}", f"quote it, e.g. '{word}'", anchor="value")
        elif kind == "string_type" and isinstance(value, (int, float)):
            hint = f"quote it: '{show(value)}'"
        return Problem.at(path, f"expected {_EXPECTED[kind]}, got {show(value)}", hint, anchor="value")
    message = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    return Problem.at(path, message, _describe(step), anchor="value")


# ----------------------------------------------------------------------------- override keys
def check_key(parts: Path, method: str, data: Any) -> Problem | None:
    """Whether `parts` names a key of the schema (peft fields depend on `method`); None if it does."""
    tp: Any = Recipe
    node = data
    for depth, part in enumerate(parts):
        here = tuple(parts[:depth])
        alternatives = members(tp)
        models = [a for a in alternatives if _is_model(a)]
        if depth == 1 and parts[0] == "peft":
            models = [method_configs().get(method, models[0])]
        lists = [a for a in alternatives if get_origin(a) is list]
        dicts = [a for a in alternatives if get_origin(a) is dict]
        if isinstance(part, int) or str(part).isascii() and str(part).isdigit():
            if not lists:
                return Problem.at((*here, part), f"`{'.'.join(map(str, here))}` is not a list", None, "key")
            size = len(node) if isinstance(node, list) else 0
            if int(part) >= size:
                return Problem.at((*here, part), f"index {part} is out of range: the list has {size} item(s)", None, "key")
            tp, node = get_args(lists[0])[0], node[int(part)]
            continue
        fields = {k: f for m in models for k, f in m.model_fields.items()}
        if part in fields:
            tp = fields[part].annotation
        elif dicts:
            tp = get_args(dicts[0])[-1]
        else:
            if not models:
                return Problem.at((*here, part), f"`{'.'.join(map(str, here))}` is a value, not a section", None, "key")
            step = _Step(path=[*here, part], parent=models[0])
            return _unknown_key(step, str(part))
        node = node.get(part) if isinstance(node, dict) else None
    return None
