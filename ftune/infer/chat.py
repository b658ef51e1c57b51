"""A multi-turn chat session, apart from the terminal: the conversation, its settings and its commands
(`/reset`, `/system TEXT`, `/set key=value`, `/save FILE`, `/help`, `/quit`). `ftune chat` drives it."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ftune import outputs
from ftune.errors import FtuneError, UsageError
from ftune.infer.load import Loaded

HELP = ("/reset  start over · /system TEXT  set the system prompt · /set temperature=0.7 (also top_p, "
        "max_new_tokens, seed) · /save FILE  append the conversation as a chat jsonl row · /quit")
SETTINGS = {"temperature": float, "top_p": float, "max_new_tokens": int, "seed": int}


class Quit(Exception):
    """/quit (or end of input)."""


@dataclass
class Session:
    loaded: Loaded
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int | None = None
    system: str | None = None
    messages: list[dict] = field(default_factory=list)
    inputs: tuple[Path, ...] = ()
    """What the session read (the model folder): /save never writes there."""
    on_note: Callable[[str], None] = lambda s: None
    """Where notes go (generation clamped to the model's context)."""

    def conversation(self) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.messages

    def command(self, line: str) -> str:
        """Run a `/command`; returns what to tell the user. Raises `Quit` for /quit, `UsageError` for bad input."""
        name, _, arg = line.strip().partition(" ")
        arg = arg.strip()
        if name in ("/quit", "/exit"):
            raise Quit
        if name == "/help":
            return HELP
        if name == "/reset":
            self.messages.clear()
            return "conversation cleared"
        if name == "/system":
            self.system = arg or None
            self.messages.clear()
            return f"system prompt {'set' if arg else 'removed'}; conversation cleared"
        if name == "/set":
            key, eq, value = arg.partition("=")
            key = key.strip()
            if not eq or key not in SETTINGS:
                raise UsageError(f"/set takes key=value with key one of {', '.join(SETTINGS)}", hint=HELP)
            try:
                parsed = SETTINGS[key](value.strip())
            except ValueError:
                raise UsageError(f"/set {key}: {value.strip()!r} is not a {SETTINGS[key].__name__}") from None
            if (key == "temperature" and parsed < 0) or (key == "top_p" and not 0 < parsed <= 1) or \
                    (key == "max_new_tokens" and parsed <= 0):
                raise UsageError(f"/set {key}: {parsed} is out of range")
            setattr(self, key, parsed)
            return f"{key} = {parsed}"
        if name == "/save":
            if not arg:
                raise UsageError("/save needs a file name, e.g. /save chats.jsonl")
            # the output policy: never a folder, a run's or model's files, or a file that isn't a chat log
            path = outputs.check_output(arg, outputs.CHAT_LOG, inputs=self.inputs, flag="/save")
            outputs.append_line(path, json.dumps({"messages": self.conversation()}, ensure_ascii=False))
            return f"saved {len(self.messages)} messages to {arg} (a `format: chat` row)"
        raise UsageError(f"unknown command {name}", hint=HELP)

    def reply(self, text: str, on_text: Callable[[str], None] = lambda s: None) -> str:
        """The model's answer to `text` (streamed to `on_text` as it is decoded), added to the conversation."""
        from ftune.infer.load import clamp_new_tokens
        from ftune.generation import encode_prompt, generate

        self.messages.append({"role": "user", "content": text})
        lo = self.loaded
        started = False

        def stream(piece: str) -> None:  # the answer as stored: without the leading space of its first word
            nonlocal started
            piece = piece if started else piece.lstrip()
            if piece:
                started = True
                on_text(piece)

        prompt = encode_prompt(lo.fmt, lo.tokenizer, {"messages": self.conversation()})
        try:
            max_new, note = clamp_new_tokens(lo.model, len(prompt), self.max_new_tokens)
        except FtuneError:
            self.messages.pop()  # the turn that did not fit: the conversation stays as it was
            raise
        if note:
            self.on_note(note)
        [completion] = generate(lo.model, lo.tokenizer, [prompt], stop_ids=lo.stop_ids,
                                max_new_tokens=max_new, temperature=self.temperature, top_p=self.top_p,
                                seed=self.seed, streamer=_streamer(lo.tokenizer, stream))
        self.messages.append({"role": "assistant", "content": completion.text})
        return completion.text


def _streamer(tokenizer, on_text: Callable[[str], None]):
    """A transformers streamer that hands each decoded piece of the answer to `on_text`."""
    from transformers import TextStreamer

    class Streamer(TextStreamer):
        def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
            if text:
                on_text(text)

    return Streamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
