"""Preference data: rows → the text columns TRL's preference trainers read.

`preference` rows become {prompt, chosen, rejected}, `unpaired-preference` rows {prompt, completion, label}.
Fields may be strings, or chat message lists (rendered here with the run's chat template, so every objective
sees the same text). The prompt keeps its last `data.max_prompt_length` tokens; TRL tokenizes the rest and
truncates prompt + completion to `data.max_seq_length` (`max_length` in the Plan). The order of steps, the
seeds and the cache are the SFT pipeline's.
"""

from __future__ import annotations

from pathlib import Path

from ftune.recipe.schema import Recipe
from ftune.datafiles.errors import DataError, row_location
from ftune.datafiles.formats import check_columns, normalize_messages
from ftune.datastage.report import DataReport
from ftune.datafiles.sources import Source

BOOKKEEPING = ["_len", "_trainable", "_truncated"]
COLUMNS = {"preference": ("prompt", "chosen", "rejected"), "unpaired-preference": ("prompt", "completion", "label")}


def features(fmt: str):
    import datasets

    cols = {c: datasets.Value("string") for c in COLUMNS[fmt]}
    if fmt == "unpaired-preference":
        cols["label"] = datasets.Value("bool")
    return datasets.Features({**cols, "_len": datasets.Value("int32"), "_trainable": datasets.Value("int32"),
                              "_truncated": datasets.Value("bool")})


def _messages(value, role: str, src: Source, i: int, fail) -> list[dict]:
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    return normalize_messages(value, src, i, fail)


def render_pair(tok, template: str, prompt, completions: list, src: Source, i: int, fail) -> tuple[str, list[str]]:
    """Prompt and completions as text. Chat fields are rendered with `template`: the prompt with the generation
    prompt, each completion as what the full conversation adds after it."""
    if all(isinstance(v, str) for v in [prompt, *completions]):
        return prompt, list(completions)
    msgs = _messages(prompt, "user", src, i, fail)
    try:
        head = tok.apply_chat_template(msgs, chat_template=template, tokenize=False, add_generation_prompt=True)
        outs = []
        for c in completions:
            full = tok.apply_chat_template(msgs + _messages(c, "assistant", src, i, fail), chat_template=template,
                                           tokenize=False)
            if not full.startswith(head):
                raise fail(i, "the chat template renders the prompt differently once a completion follows it",
                           "use a prefix-stable chat template (data.chat_template)")
            outs.append(full[len(head):].rstrip())  # a template's trailing newline after end-of-turn is no signal
    except DataError:
        raise
    except Exception as err:  # jinja raise_exception(), bad role order, ...
        raise fail(i, f"the chat template rejected the conversation: {err}") from err
    return head, outs


def encoder(src: Source, tok, template: str, max_prompt: int | None, rows: list[int]):
    fmt = src.spec.format
    f = src.spec.fields

    def fail(i: int, message: str, hint: str | None = None) -> DataError:
        return DataError(f"{src.where}: row {rows[i] + 1} of {src.spec.path}: {message}", hint=hint,
                         location=row_location(src.path, src.kind, rows[i]) if src.local else None)

    def value(batch, col, i, k):
        v = batch[col][k]
        if v is None or (isinstance(v, (str, list)) and len(v) == 0):
            raise fail(i, f"field `{col}` is empty")
        return v

    def encode(batch: dict, idx: list[int]) -> dict:
        names = COLUMNS[fmt]
        out: dict[str, list] = {c: [] for c in (*names, "_len", "_trainable", "_truncated")}
        for k, i in enumerate(idx):
            comp_cols = [f.chosen, f.rejected] if fmt == "preference" else [f.completion]
            prompt, comps = render_pair(tok, template, value(batch, f.prompt, i, k),
                                        [value(batch, c, i, k) for c in comp_cols], src, i, fail)
            ids = tok(prompt, add_special_tokens=False)["input_ids"]
            cut = max_prompt is not None and len(ids) > max_prompt
            if cut:  # keep the end of the prompt: it sits next to the completion
                prompt = tok.decode(ids[-max_prompt:])
            out["prompt"].append(prompt)
            out["_truncated"].append(cut)
            scored = len(tok(comps[0], add_special_tokens=False)["input_ids"])  # the (chosen) completion
            out["_len"].append(len(ids) + scored)
            out["_trainable"].append(scored)
            if fmt == "preference":
                out["chosen"].append(comps[0])
                out["rejected"].append(comps[1])
            else:
                label = batch[f.label][k]
                if not isinstance(label, bool):
                    raise fail(i, f"field `{f.label}` must be true or false (desirable or not), got {label!r}")
                out["completion"].append(comps[0])
                out["label"].append(label)
        return out

    return encode


def encode_source(src: Source, ds, recipe: Recipe, tok, template: str, scratch: Path, seed: int):
    import numpy as np

    check_columns(src, ds.column_names)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(ds)) if recipe.data.shuffle else np.arange(len(ds))
    if src.spec.limit:
        order = order[: src.spec.limit]
    ds = ds.select(order, keep_in_memory=True)
    from ftune.datastage.pipeline import SOURCE_ROW, map_source, truncation_report

    enc = map_source(ds, encoder(src, tok, template, recipe.data.max_prompt_length, order.tolist()), src, recipe,
                     scratch, seed, src.spec.format, batched=True, remove_columns=ds.column_names,
                     features=features(src.spec.format))
    return enc.add_column(SOURCE_ROW, order.astype(np.int64)), truncation_report(src, enc)


def preprocess(recipe: Recipe, tokenizer, train_srcs: list[Source], eval_srcs: list[Source], template: str,
               scratch: Path) -> DataReport:
    """Build the preference datasets into `scratch/train` (and `scratch/eval`) and return the report."""
    from ftune.datastage.pipeline import preprocess_text_rows

    return preprocess_text_rows(recipe, train_srcs, eval_srcs, scratch, lambda src, ds, seed: encode_source(
        src, ds, recipe, tokenizer, template, scratch, seed), BOOKKEEPING)
