"""Core cross-field rules: combinations of valid values that can't work together.

Each rule reads the typed Recipe and yields `Problem`s whose path is the key the user should
change, written as in the recipe (`peft.r`, `data.train[0].format`).
"""

from __future__ import annotations

from collections.abc import Iterator

from ftune.errors import Problem
from ftune.recipe.objectives import family_of
from ftune.recipe.rules import Rule
from ftune.recipe.schedule import eval_schedule, evaluates, save_schedule
from ftune.recipe.sources import sources
from ftune.recipe.schema import SCHEMA_VERSION, Recipe


def schema_version_supported(recipe: Recipe) -> Iterator[Problem]:
    if recipe.schema_version != SCHEMA_VERSION:
        yield Problem.at(
            "schema_version",
            f"unsupported schema_version {recipe.schema_version}; this ftune reads version {SCHEMA_VERSION}",
            f"set `schema_version: {SCHEMA_VERSION}`, or use the ftune release that wrote this recipe",
        )


def fsdp_options_need_fsdp(recipe: Recipe) -> Iterator[Problem]:
    d = recipe.distributed
    if d.fsdp is not None and d.strategy != "fsdp":
        yield Problem.at(
            "distributed.fsdp",
            f"`distributed.fsdp` options are set but distributed.strategy is '{d.strategy}'",
            "set `distributed.strategy: fsdp`, or remove the `fsdp:` block",
        )


def deepspeed_options_need_deepspeed(recipe: Recipe) -> Iterator[Problem]:
    d = recipe.distributed
    if d.deepspeed is not None and d.strategy != "deepspeed":
        yield Problem.at(
            "distributed.deepspeed",
            f"`distributed.deepspeed` options are set but distributed.strategy is '{d.strategy}'",
            "set `distributed.strategy: deepspeed`, or remove the `deepspeed:` block",
        )


def packing_needs_max_seq_length(recipe: Recipe) -> Iterator[Problem]:
    if recipe.data.packing and recipe.data.max_seq_length is None:
        yield Problem.at(
            "data.packing",
            "packing needs `data.max_seq_length` (the length rows are packed to)",
            "set `data.max_seq_length`, e.g. 2048, or `data.packing: false`",
        )


def eval_needs_eval_data(recipe: Recipe) -> Iterator[Problem]:
    if recipe.eval.per_epoch is not None and recipe.data.eval is None:
        yield Problem.at(
            "eval.per_epoch",
            f"eval.per_epoch is {recipe.eval.per_epoch} but there is no eval data",
            "set `data.eval: {split: 0.05}` (or a list of sources), or remove `eval.per_epoch`",
        )
    elif recipe.eval.strategy != "no" and recipe.data.eval is None:
        yield Problem.at(
            "eval.strategy",
            f"eval.strategy is '{recipe.eval.strategy}' but there is no eval data",
            "set `data.eval: {split: 0.05}` (or a list of sources), or `eval.strategy: 'no'` (quoted; as an override: "
            "\"eval.strategy='no'\")",
        )


def eval_on_start_needs_data(recipe: Recipe) -> Iterator[Problem]:
    if recipe.eval.on_start and recipe.data.eval is None:
        yield Problem.at(
            "eval.on_start",
            "eval.on_start needs eval data, but `data.eval` is not set",
            "set `data.eval` (e.g. `{split: 0.05}`), or `eval.on_start: false`",
        )


def benchmarks_at_steps_needs_evals(recipe: Recipe) -> Iterator[Problem]:
    bench = recipe.eval.benchmarks
    if bench is not None and "steps" in bench.at and not evaluates(recipe):
        yield Problem.at("eval.benchmarks.at", "eval.benchmarks.at has `steps`, but the run never evaluates",
                         "set `eval.strategy: steps` with `eval.steps` (or `eval.per_epoch`), or drop `steps`")


def eval_generate_needs_prompts(recipe: Recipe) -> Iterator[Problem]:
    """Generation metrics complete the eval prompts: they need eval data, a causal LM, and masked prompts."""
    if recipe.eval.generate is None:
        return
    if recipe.data.eval is None:
        yield Problem.at("eval.generate", "eval.generate needs eval data, but `data.eval` is not set",
                         "set `data.eval` (e.g. `{split: 0.05}`), or remove `eval.generate`")
    if recipe.model.task == "sequence-classification":
        yield Problem.at("eval.generate", f"eval.generate needs a causal-lm model, not model.task '{recipe.model.task}'",
                         "remove `eval.generate`: classification reports accuracy through the eval loss only")
    train = list(sources(recipe, splits=("train",)))
    formats = {s.format for _, s in train}
    defaulted = [where for where, s in train if "format" not in s.model_fields_set]
    if not formats & {"instruction", "chat", "vision-chat"} and defaulted:  # say so where the format would be written
        yield Problem.at(defaulted[0], "this source sets no `format`, so it defaulted to text; "
                         "eval.generate scores answers to prompts, which needs instruction or chat data",
                         "set `format: instruction` (alias `alpaca`), `format: chat` or `format: sharegpt` here, "
                         "or remove `eval.generate`")
    elif not formats & {"instruction", "chat", "vision-chat"}:
        yield Problem.at("eval.generate", "eval.generate scores answers to prompts, so it needs instruction or chat "
                         f"data; data.train has {', '.join(sorted(formats))}",
                         "use `format: instruction` or `format: chat` sources, or remove `eval.generate`")
    elif recipe.data.train_on == "all":
        yield Problem.at("data.train_on", "eval.generate needs prompts apart from answers, but `data.train_on: all` "
                         "trains on the prompts too", "set `data.train_on: completion`, or remove `eval.generate`")


def eval_steps_needs_steps(recipe: Recipe) -> Iterator[Problem]:
    if recipe.eval.strategy == "steps" and recipe.eval.steps is None and recipe.eval.per_epoch is None:
        yield Problem.at(
            "eval.steps",
            "eval.strategy is 'steps' but `eval.steps` is not set",
            "set `eval.steps`, e.g. 200, or `eval.strategy: epoch`",
        )


def warmup_once(recipe: Recipe) -> Iterator[Problem]:
    t = recipe.train
    if t.warmup_ratio is not None and t.warmup_steps is not None:
        yield Problem.at(
            "train.warmup_steps",
            "can't set both `train.warmup_ratio` and `train.warmup_steps`",
            "keep one of them",
        )


def training_length(recipe: Recipe) -> Iterator[Problem]:
    t = recipe.train
    if t.epochs is None and t.max_steps is None:
        yield Problem.at(
            "train",
            "set how long to train: neither `train.epochs` nor `train.max_steps` is set",
            "add `epochs: 3` or `max_steps: 1000` under `train:`",
        )


def method_rules(recipe: Recipe) -> Iterator[Problem]:
    """The PEFT method's own rules (`MethodConfig.problems`: LoRA's rank and init, prefix tuning's packing)."""
    yield from recipe.peft.problems(recipe)


def early_stopping_needs_eval(recipe: Recipe) -> Iterator[Problem]:
    if recipe.train.early_stopping is not None and not evaluates(recipe):
        yield Problem.at(
            "train.early_stopping",
            "early stopping needs evaluation, but eval.strategy is 'no'",
            "set `eval.strategy: steps` (with `eval.steps`) or `epoch`, or `eval.per_epoch`, and `data.eval`",
        )


def per_epoch_fits(recipe: Recipe) -> Iterator[Problem]:
    """`per_epoch` replaces `strategy`/`steps` and counts epochs, so it needs `train.epochs` (not max_steps)."""
    for name, section in (("eval", recipe.eval), ("checkpoint", recipe.checkpoint)):
        n = section.per_epoch
        if n is None:
            continue
        written = section.model_fields_set
        if recipe.train.epochs is None or recipe.train.max_steps is not None:
            yield Problem.at(
                f"{name}.per_epoch",
                f"{name}.per_epoch counts epochs, but the run's length is "
                + ("train.max_steps" if recipe.train.max_steps is not None else "not set in epochs"),
                f"set `train.epochs` (and remove `train.max_steps`), or use `{name}.steps`",
            )
        if "steps" in written:
            yield Problem.at(f"{name}.per_epoch", f"can't set both `{name}.steps` and `{name}.per_epoch`",
                             "keep one of them")
        if "strategy" in written and section.strategy != "steps" and not (section.strategy == "epoch" and n == 1):
            yield Problem.at(
                f"{name}.per_epoch",
                f"`{name}.per_epoch: {n}` contradicts `{name}.strategy: {section.strategy}`",
                f"remove `{name}.strategy` (per_epoch sets the schedule)",
            )


def load_best_needs_eval(recipe: Recipe) -> Iterator[Problem]:
    """load_best (and early stopping, which loads the best checkpoint at the end) needs a checkpoint at every
    evaluation: the Trainer refuses other schedules when it starts, after launch."""
    c, e = recipe.checkpoint, recipe.eval
    why = ("checkpoint.load_best" if c.load_best else "train.early_stopping" if recipe.train.early_stopping else None)
    if why is None:
        return
    if not evaluates(recipe):
        if c.load_best:  # early stopping without eval is its own rule
            yield Problem.at(
                "checkpoint.load_best",
                "load_best needs evaluation to know which checkpoint is best, but eval.strategy is 'no'",
                "set `eval.strategy` or `eval.per_epoch` (and `data.eval`), or `checkpoint.load_best: false`",
            )
    elif e.per_epoch is not None or c.per_epoch is not None:
        yield from _load_best_per_epoch(recipe, why)
    elif c.strategy != e.strategy:
        yield Problem.at(
            "checkpoint.strategy",
            f"{why} needs a checkpoint saved at every evaluation: checkpoint.strategy is '{c.strategy}', "
            f"eval.strategy is '{e.strategy}'",
            f"set `checkpoint.strategy: {e.strategy}`",
        )
    elif e.strategy == "steps" and e.steps and c.steps % e.steps:
        yield Problem.at(
            "checkpoint.steps",
            f"{why} needs checkpoint.steps ({c.steps}) to be a multiple of eval.steps ({e.steps})",
            f"set `checkpoint.steps: {e.steps * max(1, c.steps // e.steps)}`",
        )


def _load_best_per_epoch(recipe: Recipe, why: str) -> Iterator[Problem]:
    """The Trainer's load-best checks on the compiled schedules: same strategy, saves a multiple of evals
    (ratios and absolute steps never mix)."""
    c, e = recipe.checkpoint, recipe.eval
    if recipe.data.eval is None or recipe.train.epochs is None or recipe.train.max_steps is not None:
        return  # eval_needs_eval_data / per_epoch_fits say why
    (es, ev), (ss, sv) = eval_schedule(recipe), save_schedule(recipe)
    path = "checkpoint.per_epoch" if c.per_epoch is not None else "checkpoint.strategy"
    hint = (f"set `checkpoint.per_epoch: {e.per_epoch}` (or a divisor of it)" if e.per_epoch is not None
            else f"use `eval.per_epoch: {c.per_epoch}` with `checkpoint.per_epoch`")
    if es != ss:
        yield Problem.at(path, f"{why} needs a checkpoint saved at every evaluation, but with train.epochs "
                               f"{recipe.train.epochs:g} evaluations run per '{es}' and saves per '{ss}'", hint)
    elif es == "steps" and ev and sv % ev:
        multiple = ev < 1 and sv < 1 and (sv * 1_000_000) % (ev * 1_000_000) == 0
        if not multiple:
            yield Problem.at(path, f"{why} needs every save to fall on an evaluation: checkpoints every {sv:g} and "
                                   f"evaluations every {ev:g} (ratios of the run's steps) don't line up", hint)


def task_matches_format(recipe: Recipe) -> Iterator[Problem]:
    task = recipe.model.task
    for key, source in sources(recipe):
        path = f"{key}.format"
        if task == "causal-lm" and source.format == "classification":
            yield Problem.at(
                path,
                "format 'classification' needs model.task 'sequence-classification', but it is 'causal-lm'",
                "set `model.task: sequence-classification` (with model.labels), or another data format",
            )
        elif task == "sequence-classification" and source.format != "classification" \
                and not (family_of(recipe).one_logit and source.format == "preference"):
            yield Problem.at(
                path,
                f"model.task is 'sequence-classification' but this source has format '{source.format}'"
                + (" (pretokenized rows carry token labels, not one class per row)"
                   if source.format == "pretokenized" else ""),
                "use `format: classification` (a text column and a label column)",
            )


def classification_labels(recipe: Recipe) -> Iterator[Problem]:
    m = recipe.model
    if m.num_labels is not None and m.labels is not None and m.num_labels != len(m.labels):
        yield Problem.at(
            "model.num_labels",
            f"num_labels is {m.num_labels} but model.labels names {len(m.labels)} classes",
            "drop `num_labels` (it defaults to len(labels)) or make them agree",
        )
    if m.task == "sequence-classification" and m.num_labels is None and m.labels is None \
            and not family_of(recipe).one_logit:  # a reward model has one output
        yield Problem.at(
            "model.task",
            "sequence-classification needs the classes: set `model.labels` or `model.num_labels`",
            "e.g. `labels: [negative, positive]`",
        )
    if m.labels is not None and len(set(m.labels)) != len(m.labels):
        yield Problem.at("model.labels", "model.labels has duplicate names", "each class name must be unique")


def quantized_needs_adapter(recipe: Recipe) -> Iterator[Problem]:
    q, method = recipe.kbit, recipe.peft.method
    if q is not None and not recipe.peft.uses_peft_library:
        yield Problem.at(
            "quantization.bits",
            f"{q.bits}-bit quantized weights can't be trained directly with peft.method '{method}'",
            "use `peft.method: lora` on a quantized base (QLoRA), or remove `quantization`",
        )


def packing_supported(recipe: Recipe) -> Iterator[Problem]:
    if not recipe.data.packing:
        return
    if recipe.model.task == "sequence-classification":
        yield Problem.at(
            "data.packing",
            "packing applies to causal-lm; a classification row must hold exactly one sample",
            "set `data.packing: false`",
        )


RULES: list[Rule] = [
    schema_version_supported,
    fsdp_options_need_fsdp,
    deepspeed_options_need_deepspeed,
    packing_needs_max_seq_length,
    packing_supported,
    eval_needs_eval_data,
    eval_on_start_needs_data,
    eval_generate_needs_prompts,
    benchmarks_at_steps_needs_evals,
    eval_steps_needs_steps,
    warmup_once,
    training_length,
    method_rules,
    early_stopping_needs_eval,
    per_epoch_fits,
    load_best_needs_eval,
    task_matches_format,
    classification_labels,
    quantized_needs_adapter,
]
