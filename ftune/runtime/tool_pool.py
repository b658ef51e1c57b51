"""Tool calls run where a runaway can be stopped: one child process holds the recipe's tools (`train.rl.tools`),
the run sends it each call, and waits at most `train.rl.tool_timeout` seconds for the answer.

Unlike a reward past its limit (which stops the run: the reward is the recipe's), a tool past its limit is the
model's doing (a regular expression it wrote that backtracks, a power too large to compute): the child is killed
and started again on the next call, and the call is a tool error, scored `train.rl.tool_error_reward`. So is a call
that raises or whose arguments don't fit the tool's (`ToolPlugin.params`). A tool whose code fails to load stops
the run before training, naming it. The channel is reward_pool's (`_Duplex` over the child's pipes).

Light: stdlib and ftune.tools in the parent; the child imports each tool's code (and dies with its parent). Run
as `python -m ftune.runtime.tool_pool` by `ToolPool` only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ftune.errors import RunError
from ftune.runtime.reward_pool import POLL_S, START_S, ChildProcess, child_channel

RESULT_CHARS = 2000
"""A tool's answer is cut to this many characters (a result the model reads fits its context)."""


@dataclass(frozen=True)
class ToolEntry:
    """One tool as the child builds it: `make(args) -> call`, its call's arguments checked by `params`."""

    name: str
    make: str
    params: Any
    args: Any


@dataclass(frozen=True)
class Answer:
    """One call's outcome: the text the model reads, and the error (None when the call succeeded)."""

    text: str
    error: str | None = None


class ToolPool(ChildProcess):
    """The child process running `entries`; `call(name, arguments, row)` answers within `limit_s`."""

    MODULE = "ftune.runtime.tool_pool"

    def __init__(self, entries: list[ToolEntry], limit_s: float):
        self.entries, self.limit_s = {e.name: e for e in entries}, limit_s
        super().__init__()

    def _start(self) -> None:
        self._spawn()
        self.conn.send(list(self.entries.values()))
        kind, detail = self._wait(START_S) or ("timeout", None)
        if kind != "ready":
            self.kill()
            name, why = detail if kind == "failed" else ("?", f"took longer than {START_S:g} s to start")
            raise RunError(f"tool '{name}' failed to start: {why}",
                           hint="fix the tool's plugin (or uninstall it), or remove it from train.rl.tools")

    def call(self, name: str, arguments: Any, row: dict) -> Answer:
        """Run one call; never raises for the call's own failure (that is the returned Answer's error)."""
        if name not in self.entries:
            return self._error(f"no tool named {name!r} (tools: {', '.join(self.entries)})")
        if not isinstance(arguments, dict):
            return self._error(f"the arguments are {type(arguments).__name__}, not an object of name: value")
        self.start()
        try:
            self.conn.send((name, arguments, row))
        except (OSError, ValueError) as err:  # the child died between calls
            self.kill()
            return self._error(f"the tool process ended ({err})")
        got = self._wait(self.limit_s)
        if got is None:
            self.kill()  # the next call starts it again
            return self._error(f"took longer than {self.limit_s:g} s (train.rl.tool_timeout)")
        kind, detail = got
        if kind == "ok":
            return Answer(detail)
        return self._error(detail)

    @staticmethod
    def _error(why: str) -> Answer:
        return Answer(f"error: {why}", why)

    def _wait(self, limit_s: float):
        deadline = time.monotonic() + limit_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                if self.conn.poll(min(POLL_S, left)):
                    return self.conn.recv()
            except (EOFError, OSError):
                code = self.proc.wait() if self.proc is not None else None
                self.kill()
                return ("raised", f"the tool process ended (exit code {code})")
        return None


def _serve() -> None:
    """The child: build every tool, then answer each (name, arguments, row) with ("ok", text) or ("raised", why)."""
    read, write = child_channel()
    from pydantic import ValidationError

    from ftune.plugins import load_object

    calls, name = {}, "?"
    try:
        for entry in read.recv():
            name = entry.name
            calls[name] = (entry.params, load_object(entry.make)(entry.args))
    except Exception as err:  # noqa: BLE001 - a plugin's: named to the run
        write.send(("failed", (name, getattr(err, "message", None) or f"{type(err).__name__}: {err}")))
        return
    write.send(("ready", None))
    while True:
        try:
            name, arguments, row = read.recv()
        except EOFError:
            return
        params, call = calls[name]
        try:
            checked = params.model_validate(arguments)
        except ValidationError as err:
            why = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: "
                            f"{'unknown argument' if e['type'] == 'extra_forbidden' else e['msg']}"
                            for e in err.errors())
            write.send(("raised", f"bad arguments ({why})"))
            continue
        try:
            text = call(checked, row)
        except BaseException as err:  # noqa: BLE001 - the model's call (or a plugin's tool) failed: a tool error
            write.send(("raised", f"called sys.exit({err.code!r})" if isinstance(err, SystemExit)
                        else f"{type(err).__name__}: {err}"))
            continue
        if not isinstance(text, str):
            write.send(("raised", f"the tool returned {type(text).__name__}, not text"))
            continue
        write.send(("ok", text if len(text) <= RESULT_CHARS else text[:RESULT_CHARS] + " ..."))


if __name__ == "__main__":
    _serve()
