"""The recipe's tools (`train.rl.tools`) as TRL's GRPOTrainer takes them: an `environment_factory` whose class has
one method per tool (its signature and docstring are the tool's, from `ToolPlugin.params`), a `reset(**row)` that
keeps the prompt row's tool data, and a `get_reward()` that scores a completion with a failed call
`train.rl.tool_error_reward` (its other rewards count 0: `zero_failed`). TRL runs the loop: it parses each
completion for calls (`tool_format`'s parser), calls the methods, appends the results as `tool` turns, masks their
tokens from the loss (`tool_mask`) and generates on. The calls themselves run in `ToolPool`'s process.

The class is named `tool_error`: TRL names the reward column after it (`rewards/tool_error/mean`).
"""

from __future__ import annotations

import inspect
from typing import Any

from ftune.tools import available, row_columns
from ftune.runtime.tool_pool import ToolEntry, ToolPool

ERROR_REWARD = "tool_error"

PARSERS = {"hermes": "qwen3_template"}
"""`train.rl.tool_format` -> TRL's response template (trl.chat_template_utils) that finds the calls in a completion:
Qwen's `<tool_call>` JSON after `<|im_start|>assistant\\n`, up to `<|im_end|>`."""

_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool}


def entries(rl) -> list[ToolEntry]:
    known = available()
    out = []
    for spec in rl.tools:
        plugin = known[spec.name]
        args = plugin.args.model_validate(spec.args) if plugin.args is not None else None
        out.append(ToolEntry(spec.name, plugin.make, plugin.params, args))
    return out


def method(name: str, plugin):
    """A function `name(self, <params>) -> str` whose signature, annotations and docstring (Google style, as
    transformers' `get_json_schema` reads them) are the tool's; it forwards the call's arguments unchecked (the
    tool process checks them against `plugin.params`, so a wrong argument is a tool error, not a crash)."""
    schema = plugin.params.model_json_schema()
    props = schema.get("properties", {})
    required = set(schema.get("required", []))

    def tool(self, **arguments) -> str:
        return self._call(name, arguments)

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    for key, prop in props.items():
        kind = _TYPES.get(prop.get("type", "string"), str)
        annotations[key] = kind
        params.append(inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, annotation=kind,
                                        **({} if key in required else {"default": prop.get("default")})))
    annotations["return"] = str
    tool.__name__ = tool.__qualname__ = name
    tool.__signature__ = inspect.Signature(params, return_annotation=str)
    tool.__annotations__ = annotations
    lines = [plugin.description, "", "Args:"]
    lines += [f"    {key}: {' '.join((prop.get('description') or key).split())}" for key, prop in props.items()]
    tool.__doc__ = "\n".join(lines)
    return tool


def environment_factory(plan):
    """The class TRL instantiates once per concurrent rollout (and `reset`s for each), and the tool process."""
    rl = plan.recipe.train.rl
    known = available()
    found = entries(rl)
    pool = ToolPool(found, rl.tool_timeout)
    pool.start()  # a tool that fails to load stops the run here, before training
    columns = sorted({c for e in found for c in row_columns(e.name, e.args)})
    error_reward = rl.tool_error_reward

    def reset(self, **row) -> None:
        self.row = {c: row.get(c) for c in columns}
        self.calls: list[dict] = []
        self.failed = False
        return None

    def get_reward(self) -> float:
        return error_reward if self.failed else 0.0

    def _call(self, name: str, arguments: dict) -> str:
        answer = pool.call(name, arguments, self.row)
        self.calls.append({"name": name, "arguments": arguments, "result": answer.text,
                           **({"error": answer.error} if answer.error is not None else {})})
        self.failed = self.failed or answer.error is not None
        return answer.text

    def _unknown(self, name: str, arguments) -> None:
        """A call TRL couldn't route (no such tool, or not a function call): recorded as a failed call."""
        self.calls.append({"name": name, "arguments": arguments, "result": f"error: no tool named {name!r}",
                           "error": f"no tool named {name!r}"})
        self.failed = True

    body = {"reset": reset, "get_reward": get_reward, "_call": _call, "_unknown": _unknown,
            "__doc__": "The recipe's tools for one rollout (ftune.runtime.tools)."}
    body |= {spec.name: method(spec.name, known[spec.name]) for spec in rl.tools}
    cls = type(ERROR_REWARD, (), body)
    cls._ftune_pool = pool
    return cls


def note_unrouted(environments, completions) -> None:
    """Mark the rollouts whose completion called a tool TRL has no method for (TRL answers them with an error
    message itself, and counts them in tools/failure_frequency, but never reaches the environment)."""
    for env, messages in zip(environments or [], completions):
        names = set(type(env).__dict__)
        if not isinstance(messages, list):
            continue
        for m in messages:
            for call in m.get("tool_calls") or [] if isinstance(m, dict) else []:
                fn = call.get("function", {}) if isinstance(call, dict) else {}
                name = fn.get("name") if isinstance(fn, dict) else None
                if call.get("type") != "function" or not isinstance(name, str) or name.startswith("_") \
                        or name not in names or name in ("reset", "get_reward"):
                    env._unknown(str(name), fn.get("arguments") if isinstance(fn, dict) else None)


def zero_failed(func, environments_key: str = "environments"):
    """A reward function scoring 0 for the completions whose rollout had a failed tool call (their total is then
    `tool_error_reward` alone, from the environment's own reward column)."""

    def reward(prompts, completions, **kwargs) -> list:
        envs = kwargs.get(environments_key)
        scores = func(prompts=prompts, completions=completions, **kwargs)
        if not envs:
            return scores
        return [0.0 if getattr(env, "failed", False) else s for env, s in zip(envs, scores)]

    reward.__name__ = func.__name__
    return reward


def response_parser(tokenizer, tool_format: str) -> None:
    """Set the tokenizer's response template for `tool_format` (TRL reads it to find the calls)."""
    import trl.chat_template_utils as ctu

    tokenizer.response_template = getattr(ctu, PARSERS[tool_format])


def signatures(plan) -> list[dict]:
    """The tools' JSON schemas as the chat template receives them (the data stage counts the prompt with them)."""
    from ftune.tools import signature

    known = available()
    return [signature(spec.name, known[spec.name]) for spec in plan.recipe.train.rl.tools]
