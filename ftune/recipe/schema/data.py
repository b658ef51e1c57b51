"""`data:` what the model is trained on: the formats, the sources and their columns, the eval split, images."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from ftune.plugins import merged as merged_plugins
from ftune.recipe.schema.base import Section

BUILTIN_FORMATS = ("text", "instruction", "chat", "pretokenized", "classification", "preference",
                   "unpaired-preference", "prompt", "vision-chat", "vision-preference", "vision-prompt")
# a plugin format can't shadow a built-in one (ftune.plugins.merged refuses it)
FORMATS = (*BUILTIN_FORMATS, *sorted(merged_plugins("formats", BUILTIN_FORMATS).keys() - set(BUILTIN_FORMATS)))
FORMAT_ALIASES: dict[str, dict[str, Any]] = {
    "sharegpt": {"format": "chat", "fields": {"messages": "conversations", "role": "from", "content": "value"},
                 "roles": {"human": "user", "gpt": "assistant", "system": "system"}},
    "alpaca": {"format": "instruction"},
    "tokens": {"format": "pretokenized"},
}
"""Format names other tools use, and the source settings each stands for (what `ftune show` prints); keys the
recipe sets itself win over the alias's."""


class Fields(Section):
    """Column names in the source, per format. Defaults follow the common conventions."""

    text: str = "text"
    """`text` and `classification`: the text column."""
    instruction: str = "instruction"
    """`instruction`: the instruction column."""
    input: str = "input"
    """`instruction`: the optional input/context column."""
    output: str = "output"
    """`instruction`: the response column."""
    messages: str = "messages"
    """`chat` and `vision-chat`: the list of messages (sharegpt data often uses `conversations`)."""
    role: str = "role"
    """`chat`: the role key inside a message (sharegpt: `from`)."""
    content: str = "content"
    """`chat`: the content key inside a message (sharegpt: `value`)."""
    input_ids: str = "input_ids"
    """`pretokenized`: token ids."""
    labels: str = "labels"
    """`pretokenized`: optional labels (-100 = not trained)."""
    attention_mask: str = "attention_mask"
    """`pretokenized`: optional mask of 1s and 0s; tokens under a 0 (padding) are dropped, since ftune batches and
    pads rows itself."""
    label: str = "label"
    """`classification`: the label column (a name from model.labels, or an integer id); `unpaired-preference`:
    the desirable flag (true/false)."""
    prompt: str = "prompt"
    """`preference`, `unpaired-preference` and `prompt`: the prompt (a string, or a list of chat messages)."""
    answer: str = "answer"
    """`prompt`: the reference answer the rewards compare completions with (optional unless a reward reads it)."""
    chosen: str = "chosen"
    """`preference`: the preferred completion (a string, or a list of assistant messages)."""
    rejected: str = "rejected"
    """`preference`: the dispreferred completion (a string, or a list of assistant messages)."""
    completion: str = "completion"
    """`unpaired-preference`: the completion that `label` marks desirable or not."""
    images: str = "images"
    """`vision-preference` and `vision-prompt`: an optional list of image paths that fills the prompt's
    `{type: image}` parts naming no file, in order (a string prompt: its images come before the text)."""


class DataSource(Section):
    path: str
    """A local file (.jsonl/.json/.csv/.parquet/.txt), a glob of such files (`data/shard-*.jsonl`), a `save_to_disk`
    folder, or a hub dataset name."""
    format: Literal[(*FORMATS, *FORMAT_ALIASES)] = "text"  # type: ignore[valid-type]
    """How rows become tokens and labels (built in, or registered by an installed plugin); `preference`
    (prompt/chosen/rejected) and `unpaired-preference` (prompt/completion/label) feed the preference objectives
    (train.objective); `prompt` (prompt, answer?, any other columns) feeds grpo and rloo; on a vision-language model
    (`model.task: image-text-to-text`) `vision-chat` feeds sft, `vision-preference` dpo and `vision-prompt` grpo
    (docs/vision.md). Aliases: `sharegpt` = `chat` with `fields: {messages: conversations, role: from, content:
    value}` and `roles: {human: user, gpt: assistant, system: system}`; `alpaca` = `instruction`; `tokens` = `pretokenized`."""
    type: Literal["auto", "json", "csv", "parquet", "text", "disk", "hub"] = "auto"
    """Loader; `auto` picks from the file extension (or `disk` for a save_to_disk folder)."""
    split: str = "train"
    """Split to read when the source holds several; `datasets` slice syntax selects part of it: `train[:20%]`,
    `train[100:200]`, `train[:50%]+validation[:10%]`."""
    fields: Fields = Field(default_factory=Fields)
    """Column names, when they differ from the defaults."""
    template: str | None = None
    """`instruction`: prompt template with {instruction} and {input}; the output follows it (with `as_chat`: the
    user turn)."""
    as_chat: bool = False
    """`instruction`: render each row through `data.chat_template` as one user turn (instruction, then input)
    and one assistant turn (output), instead of a plain prompt template."""
    roles: dict[str, str] | None = None
    """`chat`: map source role names to user/assistant/system, e.g. {human: user, gpt: assistant}."""
    weight: float | None = Field(None, gt=0)
    """Relative sampling weight when several sources are mixed: with `data.mix: concat` the source is resampled to
    its share of the total rows; with `interleave`, the probability that the next sample comes from it."""
    limit: int | None = Field(None, gt=0)
    """Use at most this many rows of the source (streaming: of each of its files)."""

    @property
    def is_glob(self) -> bool:
        return any(c in self.path for c in "*?[")

    def files(self) -> list[str]:
        """The local files `path` names: itself, or the sorted matches of a glob (absolute paths), without the
        matches inside an ftune run dir below the pattern's fixed folder (`run_dir_matches`)."""
        from pathlib import Path

        path = Path(self.path).expanduser()
        if self.is_glob:
            return [p for p, in_run in self._matches() if not in_run]
        return [str(path.resolve())] if path.is_file() else []

    def run_dir_matches(self) -> list[str]:
        """A glob's matches that lie in an ftune run dir (its completions.jsonl, metrics.jsonl, checkpoints),
        skipped: a run's own outputs never become its (or a later run's) training data."""
        return [p for p, in_run in self._matches() if in_run] if self.is_glob else []

    def _matches(self) -> list[tuple[str, bool]]:
        import glob
        from pathlib import Path

        from ftune.outputs import RUN_MARKER

        pattern = Path(self.path).expanduser()
        fixed = next((i for i, part in enumerate(pattern.parts) if any(c in part for c in "*?[")), 0)
        root = Path(*pattern.parts[:fixed]).resolve() if fixed else Path.cwd()
        out = []
        for p in sorted(str(Path(m).resolve()) for m in glob.glob(str(pattern)) if Path(m).is_file()):
            below = [d for d in Path(p).parents if d != root and root in d.parents]
            out.append((p, any((d / RUN_MARKER).is_file() for d in below)))
        return out

    @model_validator(mode="before")
    @classmethod
    def _expand_alias(cls, data: Any) -> Any:
        """`format: sharegpt` / `alpaca`: the settings they stand for (FORMAT_ALIASES), under the recipe's own."""
        written = data.get("format") if isinstance(data, dict) else None
        alias = FORMAT_ALIASES.get(written) if isinstance(written, str) else None  # a list or dict: validation says
        if alias is None:
            return data
        out = {**data, "format": alias["format"]}
        for key in ("fields", "roles"):
            own = data.get(key)
            if key in alias and (own is None or isinstance(own, dict)):  # another type: validation reports it
                out[key] = {**alias[key], **(own or {})}
        return out


class ImageSettings(Section):
    """How `vision-chat` images are read before the model's image processor sees them (docs/vision.md)."""

    max_pixels: int = Field(1024 * 1024, gt=0)
    """The most pixels (width x height) an image may have; a larger one is scaled down to fit (`resize: fit`) or
    refused (`resize: none`)."""
    min_pixels: int = Field(1, gt=0)
    """The fewest pixels an image may have; a smaller one is scaled up (`resize: fit`) or refused (`resize: none`)."""
    resize: Literal["fit", "none"] = "fit"
    """`fit`: scale an image into [min_pixels, max_pixels] keeping its aspect ratio; `none`: refuse one outside."""
    max_per_sample: int | None = Field(None, gt=0)
    """The most images one row may carry; default: the model family's limit where it has one (LLaVA 1.5 and
    PaliGemma: 1), else no limit."""


class EvalSplit(Section):
    split: float = Field(gt=0.0, lt=1.0)
    """Fraction of the training rows held out for evaluation."""


class DataSection(Section):
    train: list[DataSource] = Field(min_length=1)
    """Training sources, mixed."""
    eval: EvalSplit | list[DataSource] | None = None
    """Eval data: `{split: 0.05}` of train, or a list of sources like `train`."""
    max_seq_length: int | None = Field(None, gt=0)
    """Truncate (and pack) to this many tokens; for preference data, prompt + completion. Unset: rows are not
    truncated, and `ftune plan` sizes activations for the longest tokenized row of the local data (docs/plan.md)."""
    max_prompt_length: int | None = Field(None, gt=0)
    """Preference data: keep at most this many prompt tokens (the end of the prompt, next to the completion)."""
    packing: bool = False
    """Pack several samples into each row; attention never crosses a sample boundary."""
    train_on: Literal["completion", "all"] = "completion"
    """Which tokens carry loss: only responses (every assistant turn for chat) or everything."""
    shuffle: bool = True
    """Shuffle the training rows (seeded by train.seed)."""
    mix: Literal["concat", "interleave"] = "concat"
    """How several training sources combine: `concat` (each resampled to its `weight` share of all rows, or taken
    whole without weights) or `interleave` (each sample drawn from a source with probability weight/Σweights, seeded
    by train.seed, as `datasets.interleave_datasets`). `ftune data` reports the realised mix."""
    mix_stopping: Literal["first_exhausted", "all_exhausted"] = "first_exhausted"
    """`interleave`: stop when the first source runs out, or when every source has been seen whole (the others
    repeat)."""
    chat_template: str | None = None
    """Chat template for `chat` rows and `as_chat` sources: a built-in name (llama3, chatml, mistral, gemma, phi3,
    qwen, qwen3, alpaca, hermes: ChatML with tool calls), a Jinja string, or unset for the tokenizer's own (ftune's default when it has none)."""
    streaming: bool = False
    """Read, tokenize and pack the training rows while training runs (a `datasets.IterableDataset`), with no cache
    and no pass over the data first: for data too large to preprocess. Needs `train.max_steps`; several processes
    split the files of each source (use at least as many files as processes)."""
    max_dropped_fraction: float = Field(0.1, ge=0.0, le=1.0)
    """Error when more than this fraction of samples has no trainable token after truncation."""
    num_proc: int | None = Field(None, gt=0)
    """Processes for preprocessing; default: one."""
    cache_dir: str | None = None
    """Where preprocessed data is cached; default: ~/.cache/ftune/data (FTUNE_CACHE overrides)."""
    images: ImageSettings = Field(default_factory=ImageSettings)
    """`vision-chat` sources: image size limits and resizing."""
