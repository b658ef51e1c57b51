"""Prompt data for online RL (grpo, rloo): rows → {prompt, answer?, ...the other columns, _row}.

The prompt is a string, or chat messages rendered here with the run's chat template and its generation prompt,
so TRL generates from plain text and every reward sees the same prompt. With `train.rl.tools` the prompt stays
chat messages (a string prompt becomes one user turn): TRL renders them with the tools' signatures and runs the
tool loop; the columns the tools read (a row's table or document) pass through like the others. `answer` (mapped by `fields.answer`)
and every other column pass through to the rewards; `_row` names the source row, so a reward that fails is
reported with the row it failed on. The prompt keeps its last `data.max_prompt_length` tokens. The order of steps,
the seeds and the cache are the SFT pipeline's.
"""

from __future__ import annotations

from pathlib import Path

from ftune.recipe.schema import Recipe
from ftune.datafiles.errors import DataError, row_location
from ftune.datafiles.formats import check_columns, normalize_messages
from ftune.datastage.report import DataReport
from ftune.datafiles.sources import Source

BOOKKEEPING = ["_len", "_truncated"]
ROW = "_row"
"""The column naming each row's source (`data.train[0] row 12 of math.jsonl`), for reward errors."""


def _answer_readers(recipe: Recipe) -> list[str]:
    from ftune.datafiles.check import answer_readers

    return answer_readers(recipe)


def tool_signatures(recipe: Recipe) -> list[dict] | None:
    """The tools' JSON schemas the chat template shows (None without tools)."""
    rl = recipe.train.rl
    if rl is None or not rl.tools:
        return None
    from ftune.tools import available, signature

    known = available()
    return [signature(spec.name, known[spec.name]) for spec in rl.tools]


def tool_columns(recipe: Recipe) -> list[str]:
    """The prompt rows' columns the tools read (their per-row data)."""
    rl = recipe.train.rl
    if rl is None or not rl.tools:
        return []
    from ftune.tools import available, row_columns

    known = available()
    out = []
    for spec in rl.tools:
        plugin = known[spec.name]
        args = plugin.args.model_validate(spec.args) if plugin is not None and plugin.args is not None else None
        out += [c for c in row_columns(spec.name, args) if c not in out]
    return out


def encode_source(src: Source, ds, recipe: Recipe, tok, template: str, scratch: Path, seed: int):
    import numpy as np

    check_columns(src, ds.column_names)
    f = src.spec.fields
    readers = _answer_readers(recipe)
    if readers and f.answer not in ds.column_names:
        raise DataError(f"{src.where}: reward {', '.join(readers)} compares completions with each row's "
                        f"`{f.answer}`, but row 1 of {src.spec.path} has: {', '.join(ds.column_names)}",
                        hint="add an answer to every row, or map its column (`fields: {answer: solution}`)",
                        location=row_location(src.path, src.kind, 0) if src.local else None)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(ds)) if recipe.data.shuffle else np.arange(len(ds))
    if src.spec.limit:
        order = order[: src.spec.limit]
    ds = ds.select(order, keep_in_memory=True)
    rows = order.tolist()
    max_prompt = recipe.data.max_prompt_length

    def fail(i: int, message: str, hint: str | None = None) -> DataError:
        return DataError(f"{src.where}: row {rows[i] + 1} of {src.spec.path}: {message}", hint=hint,
                         location=row_location(src.path, src.kind, rows[i]) if src.local else None)

    tools = tool_signatures(recipe)
    columns = tool_columns(recipe)
    missing = [c for c in columns if c not in ds.column_names]
    if missing:
        raise DataError(f"{src.where}: train.rl.tools read each row's `{'`, `'.join(missing)}`, but row 1 of "
                        f"{src.spec.path} has: {', '.join(ds.column_names)}",
                        hint="add the column to every row (the tool's per-row data), or give the tool a `path`",
                        location=row_location(src.path, src.kind, 0) if src.local else None)

    def encode(row: dict, i: int) -> dict:
        prompt = row[f.prompt]
        if prompt is None or (isinstance(prompt, (str, list)) and len(prompt) == 0):
            raise fail(i, f"field `{f.prompt}` is empty")
        if tools:
            return encode_messages(row, prompt, i)
        if not isinstance(prompt, str):
            msgs = normalize_messages(prompt, src, i, fail)
            try:
                prompt = tok.apply_chat_template(msgs, chat_template=template, tokenize=False,
                                                 add_generation_prompt=True)
            except Exception as err:  # noqa: BLE001 - jinja raise_exception(), bad role order, ...
                raise fail(i, f"the chat template rejected the conversation: {err}") from err
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        cut = max_prompt is not None and len(ids) > max_prompt
        if cut:  # keep the end of the prompt: it sits next to the completion
            prompt, ids = tok.decode(ids[-max_prompt:]), ids[-max_prompt:]
        out = {"prompt": prompt, ROW: f"{src.where} row {rows[i] + 1} of {src.spec.path}", "_len": len(ids),
               "_truncated": cut}
        if readers and row.get(f.answer) in (None, ""):
            raise fail(i, f"field `{f.answer}` is empty, and reward {', '.join(readers)} reads it")
        if f.answer in row:
            out["answer"] = None if row[f.answer] is None else str(row[f.answer])
        return out

    def encode_messages(row: dict, prompt, i: int) -> dict:
        """With tools the prompt stays chat messages (TRL renders them with the tools and runs the tool loop);
        its length is counted as TRL renders it. A prompt can't be cut at a message boundary: too long is an
        error."""
        msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else \
            normalize_messages(prompt, src, i, fail)
        try:
            text = tok.apply_chat_template(msgs, chat_template=template, tools=tools, tokenize=False,
                                           add_generation_prompt=True)
        except Exception as err:  # noqa: BLE001 - jinja raise_exception(), bad role order, ...
            raise fail(i, f"the chat template rejected the conversation: {err}") from err
        n = len(tok(text, add_special_tokens=False)["input_ids"])
        if max_prompt is not None and n > max_prompt:
            raise fail(i, f"the prompt is {n} tokens with the tools' signatures, longer than "
                       f"data.max_prompt_length ({max_prompt}); with tools a prompt is not cut",
                       hint="raise data.max_prompt_length, or shorten the prompt")
        for c in columns:
            if row.get(c) is None:
                raise fail(i, f"field `{c}` is empty, and train.rl.tools read it")
        out = {"prompt": msgs, ROW: f"{src.where} row {rows[i] + 1} of {src.spec.path}", "_len": n,
               "_truncated": False}
        if readers and row.get(f.answer) in (None, ""):
            raise fail(i, f"field `{f.answer}` is empty, and reward {', '.join(readers)} reads it")
        if f.answer in row:
            out["answer"] = None if row[f.answer] is None else str(row[f.answer])
        return out

    drop = [c for c in (f.prompt, f.answer) if c in ds.column_names and c not in ("prompt", "answer")]
    from ftune.datastage.pipeline import map_source, truncation_report

    enc = map_source(ds, encode, src, recipe, scratch, seed, "prompt", remove_columns=drop)
    return enc, truncation_report(src, enc)


def preprocess(recipe: Recipe, tokenizer, train_srcs: list[Source], eval_srcs: list[Source], template: str,
               scratch: Path) -> DataReport:
    """Build the prompt datasets into `scratch/train` (and `scratch/eval`) and return the report."""
    from ftune.datastage.pipeline import preprocess_text_rows

    return preprocess_text_rows(recipe, train_srcs, eval_srcs, scratch, lambda src, ds, seed: encode_source(
        src, ds, recipe, tokenizer, template, scratch, seed), BOOKKEEPING)
