"""Preference rules: what TRL's preference trainers can't run, refused at `validate` with the key to change.

The objectives, their data formats and their settings come from `ftune.recipe.objectives`. Whether trl is
installed is an environment check (`ftune.plan.checks.environment`).
"""

from __future__ import annotations

from collections.abc import Iterator

from ftune.errors import Problem
from ftune.recipe.objectives import KTO_KL_LOSSES, PREFERENCE_FORMATS, family_of, objective, text_format, vision_format
from ftune.recipe.rules import Rule
from ftune.recipe.sources import sources
from ftune.recipe.schema import Recipe


def formats_fit_objective(recipe: Recipe) -> Iterator[Problem]:
    obj = objective(recipe.train.objective)
    for where, src in sources(recipe):
        rows = text_format(src.format)  # vision-preference rows are preference rows with images, ...
        if rows == "chat" and src.format != "chat" and obj.data_format is not None:
            yield Problem.at(f"{where}.format", f"{src.format} rows are conversations for sft, but train.objective "
                             f"is '{obj.name}'", f"write the rows as `format: {vision_format(obj.data_format)}` "
                             f"({_shape(obj.data_format)} with images)" if obj.takes_images else
                             "set `train.objective: sft`")
        elif obj.data_format is None and rows == "prompt":
            yield Problem.at(f"{where}.format", f"{src.format} data is for online RL (completions generated and "
                             "rewarded during training), but train.objective is 'sft'",
                             "set `train.objective: grpo` (or rloo) with `train.rl.rewards`")
        elif obj.data_format is None and rows in PREFERENCE_FORMATS:
            yield Problem.at(f"{where}.format", f"{src.format} data needs a preference objective, but "
                             "train.objective is 'sft'",
                             "set `train.objective: dpo` (or orpo, simpo; kto for unpaired-preference)")
        elif obj.data_format is not None and rows != obj.data_format:
            other = {"unpaired-preference": "kto", "prompt": "grpo or rloo"}.get(rows, "dpo, orpo, simpo or reward")
            yield Problem.at(f"{where}.format", f"train.objective '{obj.name}' reads `format: {obj.data_format}` "
                             f"rows, not {src.format}",
                             f"write the rows as {_shape(obj.data_format)}"
                             + (f", or use {other}" if rows in (*PREFERENCE_FORMATS, "prompt") else ""))


def _shape(fmt: str) -> str:
    return {"preference": "{prompt, chosen, rejected}", "prompt": "{prompt, answer?, ...}"}.get(
        fmt, "{prompt, completion, label: true|false}")


def settings_fit_objective(recipe: Recipe) -> Iterator[Problem]:
    t = recipe.train
    obj = objective(t.objective)
    if t.preference is None:
        return
    if obj.data_format == "prompt":
        yield Problem.at("train.preference", f"{obj.name} is online RL: its settings go under train.rl "
                         "(beta, epsilon, num_generations, ...)", "move them to `train.rl`")
        return
    if obj.data_format is None:
        yield Problem.at("train.preference", "train.preference sets a preference objective's options, but "
                         "train.objective is 'sft'", "set `train.objective` (dpo, orpo, kto, simpo) or remove it")
        return
    for key in t.preference.model_fields_set:
        if getattr(t.preference, key) is None or key in obj.settings:
            continue
        if key == "reference":
            yield Problem.at("train.preference.reference", f"{obj.name} is reference-free: it scores no reference "
                             "model, so `reference` has no effect", "remove it (or use dpo or kto)")
        else:
            uses = ", ".join(o for o in ("dpo", "orpo", "kto", "simpo") if key in objective(o).settings)
            yield Problem.at(f"train.preference.{key}", f"{obj.name} has no `{key}` setting (used by: {uses})",
                             f"remove it; {obj.name} takes: {', '.join(obj.settings)}")
    loss = t.preference.loss_type
    if loss is not None and "loss_type" in obj.settings and loss not in obj.loss_types:
        yield Problem.at("train.preference.loss_type", f"{obj.name} has no loss_type '{loss}'",
                         f"one of: {', '.join(obj.loss_types)}")


def trainer_fits_objective(recipe: Recipe) -> Iterator[Problem]:
    t, d = recipe.train, recipe.data
    if family_of(recipe).teacher:  # its own rules (rules.distill)
        return
    if family_of(recipe).next_token_loss:
        if d.max_prompt_length is not None:
            yield Problem.at("data.max_prompt_length", "max_prompt_length truncates the prompts of preference data; "
                             "train.objective is 'sft'", "remove it, or use data.max_seq_length")
        return
    if family_of(recipe).one_logit:
        if recipe.model.task != "sequence-classification":
            yield Problem.at("model.task", "a reward model is a sequence classifier with one output (its logit "
                             f"scores a text); model.task is '{recipe.model.task}'",
                             "set `model.task: sequence-classification`")
        for key in ("labels", "num_labels"):
            if getattr(recipe.model, key) is not None:
                yield Problem.at(f"model.{key}", "a reward model has one output, the reward; it has no classes",
                                 "remove it")
    elif recipe.model.task != "causal-lm" and not (recipe.model.task == "image-text-to-text"
                                                    and objective(t.objective).takes_images):
        yield Problem.at("train.objective", f"{t.objective} trains a causal LM on completions; model.task is "
                         f"'{recipe.model.task}'", "use `model.task: causal-lm`, or `train.objective: sft`")
    if d.packing:
        yield Problem.at("data.packing", f"{t.objective} compares whole completions pair by pair; packed rows "
                         "would mix samples", "set `data.packing: false`")
    if d.train_on != "completion":
        yield Problem.at("data.train_on", f"{t.objective} scores the completions only; train_on "
                         f"'{d.train_on}' would be ignored", "remove it (completion is the default)")
    if d.max_prompt_length is not None and d.max_seq_length is not None and d.max_prompt_length >= d.max_seq_length:
        yield Problem.at("data.max_prompt_length", f"max_prompt_length ({d.max_prompt_length}) leaves no room for the "
                         f"completion in data.max_seq_length ({d.max_seq_length})",
                         "make it smaller than max_seq_length")
    if t.objective == "kto" and (t.preference is None or t.preference.loss_type in (None, *KTO_KL_LOSSES)):
        # the KL estimate pairs each row with another row's completion in the same batch, in a fixed order
        if t.per_device_batch_size != "auto" and t.per_device_batch_size < 2:  # auto: 2 rows or more
            yield Problem.at("train.per_device_batch_size", "kto estimates its KL term from the other rows of a "
                             "batch; a per-device batch of 1 has none",
                             "set train.per_device_batch_size to 2 or more (or `train.preference.loss_type: "
                             "apo_zero_unpaired`, which has no KL term)")
        if t.group_by_length:
            yield Problem.at("train.group_by_length", "kto estimates its KL term from batch neighbours in a fixed "
                             "order; grouping by length would reorder them", "remove it")
    if t.neftune_alpha is not None:
        yield Problem.at("train.neftune_alpha", f"NEFTune noise is for SFT; {t.objective} would score noisy "
                         "embeddings against a clean reference", "remove it")


RULES: list[Rule] = [formats_fit_objective, settings_fit_objective, trainer_fits_objective]
