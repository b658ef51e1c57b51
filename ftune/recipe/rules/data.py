"""Rules for what the data and tokenizer keys can't say alone: chat templates, `as_chat`, split slices, tokens,
adapter initialisation, tracker settings."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator

from ftune.chat import BUILTIN, is_jinja, strip_generation_tags
from ftune.errors import Problem
from ftune.recipe.objectives import family_of
from ftune.recipe.rules import Rule
from ftune.recipe.sources import sources
from ftune.recipe.schema import EvalSplit, Recipe

# One `+`-joined part of datasets' slice syntax: a split name, then optionally [from:to] in rows or percent.
_SPLIT_PART = re.compile(r"^\s*[\w.-]+\s*(\[\s*(-?\d+\s*%?)?\s*:\s*(-?\d+\s*%?)?\s*\])?\s*$")
_FILE_TYPES = ("json", "csv", "parquet", "text")
_FILE_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".txt")


def chat_template_known(recipe: Recipe) -> Iterator[Problem]:
    value = recipe.data.chat_template
    if not value:
        return
    if not is_jinja(value):
        if value not in BUILTIN:
            close = difflib.get_close_matches(value, BUILTIN, n=2, cutoff=0.5)
            yield Problem.at("data.chat_template", f"unknown chat template '{value}'",
                             (f"did you mean {' or '.join(repr(c) for c in close)}? " if close else "")
                             + f"built-in templates: {', '.join(BUILTIN)}; or write a Jinja template")
        return
    try:
        import jinja2
    except ImportError:  # the light install: the worker reports a broken template
        return
    # transformers adds {% generation %} ... {% endgeneration %} (assistant masks) to Jinja; plain Jinja lacks it
    plain = strip_generation_tags(value)
    try:
        jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(plain)
    except jinja2.TemplateSyntaxError as err:
        yield Problem.at("data.chat_template", f"the Jinja chat template does not parse: {err.message} "
                                               f"(template line {err.lineno})",
                         "fix the template, or use a built-in name: " + ", ".join(BUILTIN))


def as_chat_needs_instruction(recipe: Recipe) -> Iterator[Problem]:
    for where, src in sources(recipe):
        if src.as_chat and src.format != "instruction":
            yield Problem.at(f"{where}.as_chat",
                             f"as_chat renders instruction rows as a conversation, but this source's format is "
                             f"'{src.format}'",
                             "use `format: instruction`, or drop `as_chat` (chat rows always use the chat template)")


def split_syntax(recipe: Recipe) -> Iterator[Problem]:
    for where, src in sources(recipe):
        parts = src.split.split("+")
        bad = [p for p in parts if not _SPLIT_PART.match(p)]
        if bad:
            yield Problem.at(f"{where}.split", f"can't read split {src.split!r}: {bad[0]!r} is no split or slice",
                             "write a split name with an optional slice: `train`, `train[:20%]`, `train[100:200]`, "
                             "`train[:50%]+validation[:10%]`")
            continue
        is_file = src.type in _FILE_TYPES or (src.type == "auto" and src.path.lower().endswith(_FILE_SUFFIXES))
        names = {p.split("[", 1)[0].strip() for p in parts}
        if is_file and ("[" in src.split or "+" in src.split) and names != {"train"}:
            yield Problem.at(f"{where}.split", f"a file holds one split, `train`, but the slice reads "
                                               f"{', '.join(sorted(names - {'train'}))}",
                             "slice it as `train[...]`, e.g. `train[:20%]`")


def tokens_fit(recipe: Recipe) -> Iterator[Problem]:
    m = recipe.model
    added = list(m.add_tokens or [])
    for k, tok in enumerate(added):
        if not tok.strip():
            yield Problem.at(f"model.add_tokens.{k}", "an added token can't be empty or only whitespace",
                             "remove it")
        elif added.index(tok) != k:
            yield Problem.at(f"model.add_tokens.{k}", f"token {tok!r} is listed twice", "list each token once")
    if m.special_tokens is not None:
        for key, value in m.special_tokens.model_dump(exclude_none=True).items():
            if not value.strip():
                yield Problem.at(f"model.special_tokens.{key}", f"{key} can't be empty", f"remove `{key}`")
    new_rows = bool(added) or bool(m.special_tokens and m.special_tokens.model_dump(exclude_none=True,
                                                                                  exclude={"pad_token"}))
    if not new_rows:
        return
    if m.task != "causal-lm" and added:
        yield Problem.at("model.add_tokens", "added tokens train through the LM head; model.task is "
                                             f"'{m.task}'", "remove `model.add_tokens`")
    method = recipe.peft.method
    if not recipe.peft.trains_new_token_rows:
        yield Problem.at("model.add_tokens" if added else "model.special_tokens",
                         f"new token rows can't train with peft.method '{method}' (it trains no embedding)",
                         "use `peft.method: lora` (the rows train with the adapter) or `full`")


def trackers_asked(recipe: Recipe) -> Iterator[Problem]:
    o = recipe.output
    if o.trackers is None:
        return
    for name in ("wandb", "mlflow"):
        if getattr(o.trackers, name) is not None and name not in o.report_to:
            yield Problem.at(f"output.trackers.{name}",
                             f"settings for {name} are given, but output.report_to has no {name}: nothing would "
                             "be sent",
                             f"add {name} to `output.report_to`, or remove `output.trackers.{name}`")
    w, m = o.trackers.wandb, o.trackers.mlflow
    if w is not None and w.run_name and m is not None and m.run_name and w.run_name != m.run_name:
        yield Problem.at("output.trackers.mlflow.run_name",
                         "W&B and MLflow take one run name (TrainingArguments.run_name), but they differ",
                         "set one `run_name` (or the same in both)")
    for k, tag in enumerate(w.tags or [] if w is not None else []):
        if not tag or "," in tag or len(tag) > 64:
            yield Problem.at(f"output.trackers.wandb.tags.{k}",
                             f"W&B tag {tag!r} must be 1-64 characters without ','", "shorten or split the tag")


def mix_fits(recipe: Recipe) -> Iterator[Problem]:
    d = recipe.data
    if d.mix_stopping != "first_exhausted" and d.mix != "interleave":  # the default is written to resolved recipes
        yield Problem.at("data.mix_stopping", "mix_stopping applies to `data.mix: interleave` only",
                         "set `data.mix: interleave`, or remove mix_stopping")
    if d.mix == "interleave" and len(d.train) < 2:
        yield Problem.at("data.mix", "interleave mixes several training sources, but data.train has one",
                         "add sources to data.train, or remove `data.mix`")


def weights_sum(recipe: Recipe) -> Iterator[Problem]:
    """The sources' weights are divided by their sum (shares, or interleave's probabilities): a sum that overflows
    to inf makes every share 0 or NaN."""
    import math

    weights = [(i, s.weight) for i, s in enumerate(recipe.data.train) if s.weight is not None]
    if weights and not math.isfinite(sum(w for _, w in weights)):  # as the data stage sums them
        i = max(weights, key=lambda iw: iw[1])[0]
        yield Problem.at(f"data.train.{i}.weight", "the sources' weights sum past the largest float, so their "
                         "shares can't be computed", "weights are relative: scale them down (e.g. 3 and 1)")


def streaming_fits(recipe: Recipe) -> Iterator[Problem]:
    """What a stream can't do: it has no length (epochs, length grouping), is read once in order (weights that
    resample, split slices, an eval split of its rows), and feeds the SFT encoders only."""
    d, t = recipe.data, recipe.train
    if not d.streaming:
        return
    if t.max_steps is None:
        yield Problem.at("data.streaming", "streaming data has no length, so training needs train.max_steps",
                         "set train.max_steps (the number of optimizer steps to train)")
    if isinstance(d.eval, EvalSplit):
        yield Problem.at("data.eval.split", "a stream can't hold out a fraction of its rows: they are never counted",
                         "give data.eval its own files (`data.eval: [{path: eval.jsonl, limit: 1000}]`), streamed "
                         "and read up to their `limit` at each evaluation")
    for i, src in enumerate(d.eval if isinstance(d.eval, list) else []):
        if src.limit is None:
            yield Problem.at(f"data.eval.{i}", "a streamed eval source needs a bound: every evaluation reads it "
                             "from the start", f"set data.eval[{i}].limit (rows read from each of its files)")
    if not family_of(recipe).next_token_loss or recipe.model.task != "causal-lm":
        where = "train.objective" if not family_of(recipe).next_token_loss else "model.task"
        yield Problem.at(where, "streaming feeds supervised causal-LM training only",
                         "set data.streaming: false (preprocess and cache the data)")
    if t.group_by_length:
        yield Problem.at("train.group_by_length", "length grouping needs every length first; a stream has none",
                         "remove train.group_by_length, or set data.streaming: false")
    sources = [("train", i, src) for i, src in enumerate(d.train)]
    sources += [("eval", i, src) for i, src in enumerate(d.eval if isinstance(d.eval, list) else [])]
    for part, i, src in sources:
        if src.type in ("hub", "disk"):
            yield Problem.at(f"data.{part}.{i}.type", f"streaming reads local files; a {src.type} source isn't yet",
                             "point path at local .jsonl/.parquet/.csv/.txt files (a glob for many)")
        if src.split != "train":
            yield Problem.at(f"data.{part}.{i}.split", "a streamed file is read whole; split slices need its rows "
                             "counted first", "remove `split`, or set data.streaming: false")
    for i, src in enumerate(d.train):
        if src.weight is not None and d.mix != "interleave" and len(d.train) > 1:
            yield Problem.at(f"data.train.{i}.weight", "weights resample sources to shares of all rows, which a "
                             "stream can't count", "set `data.mix: interleave` (weights become probabilities)")


RULES: list[Rule] = [
    mix_fits,
    weights_sum,
    streaming_fits,
    chat_template_known,
    as_chat_needs_instruction,
    split_syntax,
    tokens_fit,
    trackers_asked,
]
