"""A multi-turn chat session, apart from the terminal: the conversation, its settings and its commands
(`/reset`, `/system TEXT`, `/set key=value`, `/image PATH`, `/save FILE`, `/help`, `/quit`). `ftune chat` drives it.

With a vision-language run, `/image PATH` attaches an image to the next user message; the conversation keeps it as
a vision-chat image part (`{type: image, image: /abs/path}`), so every turn shows the model the images so far and
`/save` writes a row a vision-chat recipe can train on."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ftune import outputs
from ftune.errors import FtuneError, UsageError
from ftune.infer.load import Loaded

HELP = ("/reset  start over · /system TEXT  set the system prompt · /set temperature=0.7 (also top_p, "
        "max_new_tokens, seed) · /image PATH  show an image with your next message (a vision-language run) · "
        "/save FILE  append the conversation as a chat jsonl row · /quit")
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
    max_images: int | None = None
    """The most images a conversation may show (the run's `data.images.max_per_sample` or the family's limit)."""
    attached: list[str] = field(default_factory=list)
    """Images (absolute paths) `/image` attached to the next user message."""

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
            self.attached.clear()
            return "conversation cleared"
        if name == "/image":
            return self.attach(arg)
        if name == "/system":
            self.system = arg or None
            self.messages.clear()
            self.attached.clear()
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
            kind = "vision-chat" if any(p.get("type") == "image" for m in self.messages for p in _parts(m)) else "chat"
            return f"saved {len(self.messages)} messages to {arg} (a `format: {kind}` row)"
        raise UsageError(f"unknown command {name}", hint=HELP)

    def attach(self, arg: str) -> str:
        """`/image PATH`: check the image (read as the run's data was) and attach it to the next user message."""
        from ftune.datafiles.images import ImageProblem, open_image
        from ftune.infer.image_prompts import NEEDS_VLM_HINT

        vision = getattr(self.loaded, "vision", None)
        if vision is None:
            raise UsageError("/image needs a vision-language run (model.task: image-text-to-text); this model reads "
                             "text only", hint=NEEDS_VLM_HINT)
        if not arg:
            raise UsageError("/image needs an image file, e.g. /image photo.png")
        limit = self.max_images
        shown = sum(1 for m in self.messages for p in _parts(m) if p.get("type") == "image") + len(self.attached)
        if limit is not None and shown >= limit:
            raise UsageError(f"/image {arg}: the model takes at most {limit} image{'s' * (limit > 1)} per "
                             f"conversation, and this one has {shown}", hint="/reset to start a new conversation")
        path = str(Path(arg).expanduser().resolve())
        try:
            image, _ = open_image(path, vision.settings)
        except ImageProblem as err:
            hint = "a path relative to where `ftune chat` runs, or an absolute one" if not Path(path).exists() \
                else err.hint
            raise UsageError(f"/image {arg}: {err.message}", hint=hint) from None
        self.attached.append(path)
        n = len(self.attached)
        return (f"image attached: {path} ({image.size[0]}x{image.size[1]} as the model sees it); it goes with your "
                f"next message" + (f" ({n} images)" if n > 1 else ""))

    def reply(self, text: str, on_text: Callable[[str], None] = lambda s: None) -> str:
        """The model's answer to `text` (streamed to `on_text` as it is decoded), added to the conversation."""
        from ftune.infer.load import clamp_new_tokens
        from ftune.generation import encode_prompt, generate

        if self.attached:  # a vision-chat message: the images first, then the text
            content = [*({"type": "image", "image": p} for p in self.attached), {"type": "text", "text": text}]
            self.messages.append({"role": "user", "content": content})
        else:
            self.messages.append({"role": "user", "content": text})
        lo = self.loaded
        started = False

        def stream(piece: str) -> None:  # the answer as stored: without the leading space of its first word
            nonlocal started
            piece = piece if started else piece.lstrip()
            if piece:
                started = True
                on_text(piece)

        images, pixels = None, None
        try:
            if lo.vision is not None:
                from ftune.datafiles.images import ImageProblem
                from ftune.infer.image_prompts import image_prompt

                try:
                    shown = image_prompt(self.conversation(), Path.cwd(), lo.vision.settings)
                except ImageProblem as err:  # an attached image removed or changed since /image
                    raise UsageError(f"{err.message} (in {err.field})", hint="/reset and attach it again") from None
                prompt = lo.vision.encode(shown)
                images, pixels = [shown.images], lo.vision.pixels
            else:
                prompt = encode_prompt(lo.fmt, lo.tokenizer, {"messages": self.conversation()})
            max_new, note = clamp_new_tokens(lo.model, len(prompt), self.max_new_tokens)
        except FtuneError:
            self.messages.pop()  # the turn that did not fit: the conversation stays as it was (its images too)
            raise
        self.attached = []
        if note:
            self.on_note(note)
        [completion] = generate(lo.model, lo.tokenizer, [prompt], stop_ids=lo.stop_ids,
                                max_new_tokens=max_new, temperature=self.temperature, top_p=self.top_p,
                                seed=self.seed, streamer=_streamer(lo.tokenizer, stream), images=images,
                                pixels=pixels)
        self.messages.append({"role": "assistant", "content": completion.text})
        return completion.text


def _parts(message: dict) -> list[dict]:
    content = message.get("content")
    return [p for p in content if isinstance(p, dict)] if isinstance(content, list) else []


def _streamer(tokenizer, on_text: Callable[[str], None]):
    """A transformers streamer that hands each decoded piece of the answer to `on_text`."""
    from transformers import TextStreamer

    class Streamer(TextStreamer):
        def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
            if text:
                on_text(text)

    return Streamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
