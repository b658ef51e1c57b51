"""The data stage: recipe + tokenizer -> train/eval datasets, a collator and a report.

`build` is what the worker calls, and `ftune data` (which shows it and fills the same cache): below both sides,
with the tokenizer loader (`tokenizer`) and importing neither. Rooms here: packing (rows + collators), cache (keyed, atomic), report
(numbers), pipeline (the order of steps), preference; the light rooms both sides share (sources, formats,
masking, errors, and the pre-launch `check`) live in `ftune.datafiles`.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field

from ftune.plan.batching import DataPlan
from ftune.plugins import installed
from ftune.recipe.schema import Recipe
from ftune.datafiles.chat_rows import chat_template_of
from ftune.datafiles.errors import DataError
from ftune.datastage.report import DataReport

__all__ = ["DataBundle", "DataError", "DataReport", "build", "chat_template_of"]


@dataclass
class DataBundle:
    """What the data stage hands to training.

    Losses are token means over labels != -100 for train and eval alike (packed or not), so
    `eval_loss` is a per-token loss with the same semantics as the training loss.
    """

    train: object  # datasets.Dataset
    eval: object | None  # datasets.Dataset | None
    collator: Callable[[list[dict]], dict] | None  # None: the trainer's own (TRL's preference collators)
    report: DataReport
    label_names: list[str] | None = None
    mechanism: str = "padding"
    """How rows are batched (`ftune.plan.batching`): padding | position_ids | block_mask | padding_free."""
    warnings: list[str] = field(default_factory=list)
    """Problems that don't stop training but will show later (a stop token never trained)."""


def _datasets(entry):
    """A cache entry's train and eval datasets (eval None when the recipe has none)."""
    import datasets

    evals = datasets.load_from_disk(str(entry / "eval")) if (entry / "eval").exists() else None
    return datasets.load_from_disk(str(entry / "train")), evals


def build(
    recipe: Recipe,
    tokenizer,
    decided: DataPlan,
    *,
    main_process_first: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    log: Callable[[str], None] = print,
    processor=None,
) -> DataBundle:
    """Preprocess (or read from the cache) the recipe's data for training with `tokenizer`, as the Plan decided
    (`decided` is `Plan.data`: batching, packing, the cache root, samples per step). `processor`: a
    vision-language model's (AutoProcessor), for vision-chat rows."""
    from pathlib import Path

    from ftune.datastage.cache import Cache, make_key, tokenizer_fingerprint
    from ftune.datastage import preference, prompt
    from ftune.datastage.pipeline import preprocess
    from ftune.datafiles.sources import content_hash, resolve
    from ftune.recipe.sources import sources

    data = recipe.data
    train_srcs = [resolve(s, where) for where, s in sources(recipe, splits=("train",))]
    eval_srcs = [resolve(s, where) for where, s in sources(recipe, splits=("eval",))]  # none for a split of train
    vision = processor is not None
    if vision:
        from ftune.datastage import vision_chat as vision_data

        template = vision_data.template_of(recipe, processor)
    else:
        template = chat_template_of(recipe, tokenizer)
    if data.streaming:
        from ftune.datastage.stream import build_stream

        train, evals, report = build_stream(recipe, tokenizer, template, train_srcs, eval_srcs, decided.packing)
        for line in report.lines():
            log(line)
        return DataBundle(train, evals, _collator(recipe, tokenizer, decided), report, None, decided.collator)
    key = make_key(
        data_section=data.model_dump(mode="json", exclude={"cache_dir", "num_proc"}),
        extra={"task": recipe.model.task, "labels": recipe.model.labels, "num_labels": recipe.model.num_labels,
               "seed": recipe.train.seed,
               # tools keep the prompts as messages, counted with the tools' signatures
               **({"tools": [t.model_dump(mode="json") for t in recipe.train.rl.tools]}
                  if recipe.train.rl is not None and recipe.train.rl.tools else {}),
               # a plugin format's code is part of the result: its version is part of the key
               "plugins": sorted({installed().versions[s.spec.format] for s in train_srcs + eval_srcs
                                  if s.spec.format in installed().formats}),
               # vision-chat: what the images hold and how they become tokens
               **({"images": vision_data.images_digest(train_srcs + eval_srcs, data.images),
                   "image_processor": processor.image_processor.to_json_string(),
                   "max_images": decided.max_images} if vision else {})},
        files={s.path: content_hash(s) for s in train_srcs + eval_srcs},
        tokenizer=tokenizer_fingerprint(tokenizer),
        template=template,
    )
    cache = Cache(Path(decided.cache))
    with main_process_first():
        entry, corrupt = cache.lookup(key), None
        if entry is not None:
            corrupt = cache.verify(entry)
            if corrupt is None:
                try:
                    report = DataReport.from_dict(json.loads((entry / "report.json").read_text()))
                    train, evals = _datasets(entry)
                except Exception as err:  # noqa: BLE001 - any unreadable entry is rebuilt, never fatal
                    corrupt = f"it does not load ({type(err).__name__})"
            if corrupt is not None:
                cache.discard(entry)
                entry = None
            else:
                report.cache_hit, report.cache_reason = True, "same data files, tokenizer, template and recipe"
        if entry is None:
            reason = f"entry corrupt, rebuilt: {corrupt}" if corrupt else cache.why_miss(key)
            scratch = cache.scratch()
            try:
                if vision and decided.rows != "sft":  # vision-preference / vision-prompt rows for TRL
                    from ftune.datastage import vision_rows

                    report = vision_rows.preprocess(recipe, processor, train_srcs, eval_srcs, template, scratch,
                                                    decided.max_images, log=log)
                elif vision:
                    report = vision_data.preprocess(recipe, processor, train_srcs, eval_srcs, template, scratch,
                                                    decided.max_images, log=log)
                elif decided.rows == "prompt":  # the family's rows (Plan.data.rows)
                    report = prompt.preprocess(recipe, tokenizer, train_srcs, eval_srcs, template, scratch)
                elif decided.rows == "preference":
                    report = preference.preprocess(recipe, tokenizer, train_srcs, eval_srcs, template, scratch)
                else:
                    report, _ = preprocess(recipe, tokenizer, train_srcs, eval_srcs, template, scratch,
                                           decided.packing, log=log)
                entry = cache.commit(scratch, key)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            report.cache_hit, report.cache_reason = False, reason
            train, evals = _datasets(entry)
    report.cache_path = str(entry)
    report.step_samples = decided.step_samples
    for line in report.lines():
        log(line)

    how = decided.collator
    if decided.rows != "sft":  # TRL tokenizes the text columns and brings its own collator
        return DataBundle(train, evals, None, report, None, how)
    collate = _collator(recipe, tokenizer, decided, processor)
    return DataBundle(train, evals, collate, report, report.label_names, how, report.warnings())


def _collator(recipe: Recipe, tokenizer, decided: DataPlan, processor=None):
    """The collator for the batching the Plan decided (`decided.collator`), cached or streamed rows alike (streaming
    feeds causal-LM text only: never the vision or classification collator)."""
    from ftune.datastage import packing

    pad = next(t for t in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0) if t is not None)
    how = decided.collator
    if processor is not None:
        from ftune.datastage.vision_chat import VisionCollator

        return VisionCollator(pad, processor, recipe.data.images)
    if recipe.model.task == "sequence-classification":
        return packing.ClassificationCollator(pad)
    if how == "padding_free":
        return packing.PaddingFreeCollator()
    if how in ("position_ids", "block_mask"):
        return packing.PackedCollator(pad, how, recipe.model.attn_implementation, decided.pad_to_multiple_of)
    return packing.PaddingCollator(pad, decided.pad_to_multiple_of)
