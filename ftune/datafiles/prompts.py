"""How a run's prompts reach the model after training, decided once before launch from its training data.

`ftune generate`, `chat`, `eval` (eval.generate), the end of `ftune run` and `ftune merge` (the merged folder's chat
template) prompt a trained model the way its training data was rendered: through the chat template with the
assistant's generation prompt (chat rows, instruction rows `as_chat`, image rows, and preference or prompt rows that
hold chat messages), through the instruction template, or as plain text. Each format's row in `STYLES` says which; a
format whose rows may be either strings or chat messages (preference, unpaired-preference, prompt) is read: its
first rows, peeked as the files-tier checks peek them, say. The compiler records the result as `Plan.prompt`;
`ftune.generation.prompt_format` reads it. Light: the standard library, pydantic and the light row reader.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from ftune.recipe.schema import Recipe
from ftune.recipe.sources import sources

Kind = Literal["text", "instruction", "chat"]


@dataclass(frozen=True)
class PromptStyle:
    """How a format's rows put their prompts in front of the model during training."""

    kind: Kind
    """What its rows' prompts are: plain text, an instruction template around the instruction, or a conversation
    rendered with the chat template (`instruction` with `as_chat: true` is chat)."""
    messages: tuple[str, ...] = ()
    """The `fields` keys whose values may be chat message lists instead of strings: a row holding one is rendered
    with the chat template (`ftune.datastage.preference.render_pair`, `ftune.datastage.prompt`), so the source's
    prompts are chat once its rows hold messages."""


STYLES: dict[str, PromptStyle] = {
    "text": PromptStyle("text"),
    "pretokenized": PromptStyle("text"),
    "classification": PromptStyle("text"),
    "instruction": PromptStyle("instruction"),
    "chat": PromptStyle("chat"),
    "preference": PromptStyle("text", ("prompt", "chosen", "rejected")),
    "unpaired-preference": PromptStyle("text", ("prompt", "completion")),
    "prompt": PromptStyle("text", ("prompt",)),
    # image rows are always messages, rendered with the processor's chat template
    "vision-chat": PromptStyle("chat"),
    "vision-preference": PromptStyle("chat"),
    "vision-prompt": PromptStyle("chat"),
}
"""Each built-in format's prompts. A plugin format's are plain text: its encoder makes tokens ftune can't read back
as a template."""
PLUGIN_STYLE = PromptStyle("text")


class RunPrompts(BaseModel):
    """The run's prompt format as the compiler decided it (`Plan.prompt`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Kind
    template: str | None = None
    """instruction: the source's `template` (None: Alpaca's, with or without an input)."""
    source: str | None = None
    """The recipe key of the training source that decided (`data.train[0]`); None when none did."""
    reason: str
    """Why, in a line (shown by `ftune plan` when the rows decided)."""

    @property
    def chat(self) -> bool:
        """Prompts go through the chat template (which final/'s tokenizer then carries)."""
        return self.format == "chat"


def style_of(fmt: str) -> PromptStyle:
    return STYLES.get(fmt, PLUGIN_STYLE)


def decide(recipe: Recipe) -> RunPrompts:
    """The prompt format of a run: its first training source that renders prompts through a template decides (chat
    or instruction); without one, plain text. A source of preference or prompt rows is chat when its first rows hold
    chat messages, or when `train.rl.tools` keep every prompt as messages (TRL renders them with the tools)."""
    rl = recipe.train.rl
    tools = rl is not None and bool(rl.tools)
    unread: list[str] = []
    plain: list[str] = []
    for where, spec in sources(recipe, splits=("train",)):
        style = style_of(spec.format)
        if style.kind == "chat" or (style.kind == "instruction" and spec.as_chat):
            how = f"{spec.format} data" + (" with as_chat" if style.kind == "instruction" else "")
            return RunPrompts(format="chat", source=where, reason=f"{where} is {how}")
        if style.kind == "instruction":
            return RunPrompts(format="instruction", template=spec.template, source=where,
                              reason=f"{where} is instruction data")
        if not style.messages:
            continue
        found = messages_in(where, spec, style.messages)
        if tools and not found:  # a string prompt becomes a user turn
            return RunPrompts(format="chat", source=where, reason="train.rl.tools keep the prompts as chat messages, "
                              "rendered with the chat template")
        if found is None:
            unread.append(where)
        elif found:
            return RunPrompts(format="chat", source=where, reason=f"{where}'s rows hold chat messages ({found})")
        else:
            plain.append(where)
    if unread:
        return RunPrompts(format="text", reason=f"{', '.join(unread)} could not be read before launch (not on disk, "
                          "or a hub dataset not in the cache), so plain text is assumed")
    if plain:
        return RunPrompts(format="text", reason=f"{', '.join(plain)} holds plain-string prompts")
    return RunPrompts(format="text", reason="no training source renders prompts through a template")


def note(recipe: Recipe, decided: RunPrompts) -> str | None:
    """The line `ftune plan` shows when the rows decided (preference or prompt data, whose rows may be strings or
    chat messages); None when the formats alone say it."""
    if not any(style_of(spec.format).messages for _, spec in sources(recipe, splits=("train",))):
        return None
    return f"prompts after training (generate, chat, eval, merge): {decided.format}: {decided.reason}"


def messages_in(where: str, spec, fields: tuple[str, ...]) -> str | None:
    """Where the first rows of a source hold a chat message list in one of `fields` ("field `prompt`, row 1 of
    pairs.jsonl"), "" when they hold none, None when it can't be read here (a missing file, a hub dataset not in
    the cache); a `save_to_disk` folder is read at its features. A glob is read at its first file (every file
    has the same columns)."""
    from ftune.datafiles.check import PEEK_ROWS
    from ftune.datafiles.errors import DataError
    from ftune.datafiles.sources import disk_features, peek, peek_hub, resolve, split_names

    try:
        src = resolve(spec, where)
        if src.kind == "disk":  # no rows read lightly, but its features say which columns are lists
            features = disk_features(Path(src.path), split_names(spec.split)[0])
            listed = [getattr(spec.fields, k) for k in fields if _is_list(features.get(getattr(spec.fields, k)))]
            return f"field `{listed[0]}` of {spec.path}" if listed else ("" if features else None)
        peeked = peek(src, PEEK_ROWS) if src.local else peek_hub(src, PEEK_ROWS)
    except (DataError, OSError, ValueError):  # the files-tier checks report what is wrong with it
        return None
    if not peeked or not peeked[1]:
        return None
    shown = spec.files()[0] if spec.type != "hub" and spec.is_glob else spec.path  # the file `peek` read
    for n, row in enumerate(peeked[1], start=1):
        for key in fields:
            col = getattr(spec.fields, key)
            if isinstance(row.get(col), list):
                return f"field `{col}`, row {n} of {shown}"
    return ""


def _is_list(feature) -> bool:
    """A `datasets` feature (as dataset_info.json writes it) holding a list: `[{...}]`, or List / Sequence /
    LargeList (message structs under `feature`)."""
    return isinstance(feature, list) or (isinstance(feature, dict) and feature.get("_type") in
                                          ("List", "Sequence", "LargeList"))
