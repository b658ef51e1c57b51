"""Distillation rules (`train.objective: distill`) and a student built from a model's layers (`model.init_from`):
the section belongs to the objective, its settings fit the loss, the rows keep their prompts when the student
samples, and the layers listed are increasing and each once. Refused at `validate`, located at the key.

Whether the teacher shares the student's tokenizer and whether the layers exist in `init_from.path`'s config are
read from their folders (`ftune.plan.distill`, the files tier of `ftune.plan.checks`).
"""

from __future__ import annotations

from collections.abc import Iterator

from ftune.errors import Problem
from ftune.recipe.objectives import family_of
from ftune.recipe.rules import Rule
from ftune.recipe.schema import Recipe
from ftune.recipe.sources import sources

NO_PROMPT_FORMATS = ("text", "pretokenized")
"""sft formats whose rows have no prompt to complete (a pretokenized row's labels may mask one, but nothing says)."""


def distill_section(recipe: Recipe) -> Iterator[Problem]:
    t = recipe.train
    if not family_of(recipe).teacher:
        if t.distill is not None:
            yield Problem.at("train.distill", f"train.distill sets distillation options, but train.objective is "
                             f"'{t.objective}'", "set `train.objective: distill`, or remove train.distill")
        return
    if t.distill is None:
        yield Problem.at("train.objective", "distill learns from a teacher, and the recipe names none",
                         "add `train.distill: {teacher: PATH}` (a model folder sharing the student's tokenizer)")
        return
    d = t.distill
    if d.beta is not None and d.loss != "jsd":
        yield Problem.at("train.distill.beta", f"beta mixes the generalized JSD; loss '{d.loss}' has no mix",
                         "remove it, or set `train.distill.loss: jsd`")
    generates = d.on_policy > 0 or d.teacher_sequences
    if not generates:
        for key in ("temperature", "max_new_tokens"):
            if key in d.model_fields_set:
                yield Problem.at(f"train.distill.{key}", f"{key} shapes generated completions; with on_policy 0 "
                                 "and teacher_sequences off nothing is generated", "remove it, or set on_policy")


def distill_rows(recipe: Recipe) -> Iterator[Problem]:
    """The rows a distillation run reads: causal-LM, unpacked, and (when completions are sampled) with a prompt."""
    t, data = recipe.train, recipe.data
    if not family_of(recipe).teacher or t.distill is None:
        return
    if recipe.model.task != "causal-lm":
        yield Problem.at("model.task", f"distill matches a teacher's next-token distributions; model.task is "
                         f"'{recipe.model.task}'", "use `model.task: causal-lm`")
    if data.packing:
        yield Problem.at("data.packing", "distill keeps each row whole (its prompt is what the student and teacher "
                         "complete); packed rows would mix samples", "set `data.packing: false`")
    if data.max_prompt_length is not None:
        yield Problem.at("data.max_prompt_length", "max_prompt_length truncates the prompts of preference data",
                         "remove it, or use data.max_seq_length")
    if t.distill.on_policy == 0 and not t.distill.teacher_sequences:
        return
    why = "on_policy > 0" if t.distill.on_policy > 0 else "teacher_sequences"
    if data.train_on != "completion":
        yield Problem.at("data.train_on", f"with {why} completions are generated from each row's prompt; "
                         "train_on 'all' trains the prompt too, so no row has one",
                         "remove it (completion is the default), or set on_policy: 0")
    for where, src in sources(recipe):
        if src.format in NO_PROMPT_FORMATS:
            yield Problem.at(f"{where}.format", f"{src.format} rows have no prompt to generate a completion from "
                             f"({why})", "use prompt/completion rows (instruction, chat), or set on_policy: 0")


def init_layers(recipe: Recipe) -> Iterator[Problem]:
    m = recipe.model
    if m.init_from is None:
        return
    layers = m.init_from.layers
    for i, layer in enumerate(layers):
        if layer < 0:
            yield Problem.at(f"model.init_from.layers.{i}", f"layer {layer} is negative",
                             "count layers from 0 (the first decoder layer)")
        elif i and layer <= layers[i - 1]:
            what = "is listed twice" if layer == layers[i - 1] else f"comes after {layers[i - 1]}"
            yield Problem.at(f"model.init_from.layers.{i}", f"layer {layer} {what}: the layers are copied in "
                             "order, each once", "list them increasing, without repeats (e.g. [0, 2, 4, ...])")
    if m.path != m.init_from.path:
        yield Problem.at("model.path", f"model.path ({m.path}) and model.init_from.path ({m.init_from.path}) "
                         "differ: the model is built from init_from.path's layers, with its config and tokenizer",
                         "remove model.path (it is init_from.path)")
    if m.init != "pretrained":
        yield Problem.at("model.init", "model.init_from copies trained layers; `init: random` would discard them",
                         "remove model.init, or model.init_from")
    if recipe.kbit is not None:
        yield Problem.at("model.init_from", "a student built from layers is built in full precision; quantized "
                         "loading would quantize the whole source first", "remove quantization.bits")


RULES: list[Rule] = [distill_section, distill_rows, init_layers]
