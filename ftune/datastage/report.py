"""What preprocessing did, in numbers: rows, kept/dropped/truncated samples, tokens, lengths, packing, cache.

Stored beside each cache entry (report.json) so a cache hit reports the same numbers as the run that
built it; printed by the worker and by `ftune data`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class SourceReport:
    where: str  # recipe key, e.g. data.train[0]
    path: str
    format: str
    rows: int  # rows read (after limit)
    samples: int  # rows kept (trainable)
    dropped: int  # rows without a trainable token after truncation
    truncated: int  # rows longer than max_seq_length
    used: int = 0  # samples in the mix (after weight and eval split)
    turns: int = 0  # trained answer spans checked for a final stop token (chat/instruction, completion only)
    unstopped: int = 0  # of those, spans whose last trained token is no stop token
    stops: list[str] = field(default_factory=list)  # the stop tokens looked for
    # chat rows the template renders but that are likely mistakes (counted over the rows read)
    assistant_first: int = 0  # the first non-system turn is the assistant's
    user_twice: int = 0  # two user turns in a row
    empty_content: int = 0  # a message with empty (or whitespace-only) content
    first_anomaly: dict[str, int] = field(default_factory=dict)  # kind -> first row (1-based) showing it


@dataclass
class DataReport:
    sources: list[SourceReport] = field(default_factory=list)
    train_samples: int = 0
    eval_samples: int = 0
    tokens: int = 0  # train tokens after truncation
    trainable_tokens: int = 0  # train tokens that carry loss
    length_min: int = 0  # token lengths of train samples before truncation
    length_mean: float = 0.0
    length_p95: int = 0
    length_max: int = 0
    histogram: list[tuple[int, int, int]] = field(default_factory=list)  # (lo, hi, count), hi exclusive
    max_seq_length: int | None = None
    packing: bool = False
    packed_rows: int | None = None
    fill: float | None = None  # tokens / (packed rows x max_seq_length)
    eval_packed_rows: int | None = None
    label_names: list[str] | None = None
    cache_hit: bool = False
    cache_reason: str = ""
    cache_path: str = ""
    step_samples: int | None = None  # per-device batch x accumulation x world size (set per run, not cached)
    streaming: bool = False  # data.streaming: read while training; nothing counted before
    stream_files: int = 0
    images: dict | None = None  # vision-chat: count, rows with images, sizes, image tokens, conversion notes
    stream_eval_files: int = 0  # eval sources' files, read up to their limit at each evaluation

    # The totals the issue names, across sources.
    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.sources)

    @property
    def dropped(self) -> int:
        return sum(s.dropped for s in self.sources)

    @property
    def truncated(self) -> int:
        return sum(s.truncated for s in self.sources)

    @property
    def kept(self) -> int:
        return sum(s.samples for s in self.sources)

    def as_dict(self) -> dict:
        out = asdict(self)
        out.update(rows=self.rows, kept=self.kept, dropped=self.dropped, truncated=self.truncated)
        return out

    @classmethod
    def from_dict(cls, d: dict) -> DataReport:
        d = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        d["sources"] = [SourceReport(**s) for s in d.get("sources", [])]
        d["histogram"] = [tuple(b) for b in d.get("histogram", [])]
        return cls(**d)

    def warnings(self) -> list[str]:
        """What would make the run silently wrong: answers that end without a trained stop token, chat rows
        that look malformed, and an optimizer step larger than the training set."""
        out = [f"{s.where}: {s.unstopped} of {s.turns} trained answers end without a trained stop token "
                f"({', '.join(s.stops) or 'the tokenizer has no eos_token'}): the model will not learn to stop "
                "generating. Use a chat template whose turns end in eos_token or a one-token end-of-turn marker "
                "(add it with model.add_tokens and set model.special_tokens.eos_token to it)"
                for s in self.sources if s.unstopped]
        for s in self.sources:
            for kind, n, what in (("assistant_first", s.assistant_first, "start with an assistant turn"),
                                  ("user_twice", s.user_twice, "have two user turns in a row"),
                                  ("empty_content", s.empty_content, "have a message with empty content")):
                if n:
                    first = s.first_anomaly.get(kind)
                    out.append(f"{s.where}: {n} of {s.rows} chat rows {what}"
                               + (f" (first: row {first} of {s.path})" if first else "")
                               + ": check the data (roles, field mapping) before training on it")
        samples = self.packed_rows if self.packing and self.packed_rows is not None else self.train_samples
        if self.step_samples and samples and self.step_samples > samples:
            out.append(f"one optimizer step takes {self.step_samples} samples (per_device_batch_size x "
                       f"gradient_accumulation_steps x world size) but the training set has {samples}"
                       + (" packed rows" if self.packing else "") + ": a single step is more than an epoch. "
                       "Lower the batch (train.global_batch_size, or per_device_batch_size and "
                       "gradient_accumulation_steps), or add data")
        return out

    def lines(self) -> list[str]:
        """A short human summary (what the worker logs)."""
        if self.streaming:
            return [f"data: streaming {self.stream_files} file(s): rows are read, tokenized"
                    + (f" and packed into rows of {self.max_seq_length}" if self.packing else "")
                    + " while training runs; nothing is counted or cached first"
                    + (f"; eval streamed from {self.stream_eval_files} file(s), up to each source's limit"
                       if self.stream_eval_files else "")]
        out = [
            f"data: {self.rows} rows -> {self.kept} samples ({self.dropped} dropped without a trainable token, "
            + (f"{self.truncated} truncated at {self.max_seq_length})" if self.max_seq_length is not None
               else "no length limit)"),
            f"data: train {self.train_samples} samples, eval {self.eval_samples}; {self.tokens} tokens, "
            f"{self.trainable_tokens} trained ({_pct(self.trainable_tokens, self.tokens)})",
            f"data: lengths min {self.length_min} · mean {self.length_mean:.1f} · p95 {self.length_p95} "
            f"· max {self.length_max}",
        ]
        trained = [s for s in self.sources if s.where.startswith("data.train")]
        if len(trained) > 1:
            total = sum(s.used for s in trained) or 1
            out.append("data: mix " + " · ".join(f"{s.where} {s.used} ({s.used / total:.1%})" for s in trained))
        out += [f"data: WARNING {w}" for w in self.warnings()]
        if self.images is not None:
            im = self.images
            out.append(f"data: images {im['count']} in {im['rows']} of {self.train_samples} train samples; sizes "
                       "(after resize) "
                       f"{im['min_size']} .. {im['max_size']}; {im['tokens']} image tokens "
                       f"({_pct(im['tokens'], im['all_tokens'])} of the tokens, never trained)")
            out += [f"data: note: {n}" for n in im.get("notes", [])]
        if self.packing:
            out.append(f"data: packed into {self.packed_rows} rows of {self.max_seq_length}, fill {self.fill:.3f}")
        state = "hit" if self.cache_hit else f"miss ({self.cache_reason})"
        out.append(f"data: cache {state}: {self.cache_path}")
        return out


def _pct(a: int, b: int) -> str:
    return f"{100 * a / b:.1f}%" if b else "0%"


def length_stats(lengths, bins: int = 10) -> dict:
    """min/mean/p95/max and an equal-width histogram of `lengths` (a numpy array)."""
    import numpy as np

    if len(lengths) == 0:
        return {}
    lo, hi = int(lengths.min()), int(lengths.max())
    edges = np.linspace(lo, hi + 1, num=min(bins, hi + 1 - lo) + 1).round().astype(int)
    counts, _ = np.histogram(lengths, bins=edges)
    return {
        "length_min": lo,
        "length_mean": float(lengths.mean()),
        "length_p95": int(np.percentile(lengths, 95)),
        "length_max": hi,
        "histogram": [(int(a), int(b), int(c)) for a, b, c in zip(edges[:-1], edges[1:], counts)],
    }
