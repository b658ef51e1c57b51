"""Online RL rules (grpo, rloo): the rewards a recipe names exist and their arguments fit, the generation batch
holds whole groups, and the settings belong to the objective. Refused at `validate`, located at the key.

Whether the data has the `answer` column a reward reads is checked where the data is read (`ftune validate
--check-paths`, the data stage); vLLM without CUDA and a reward model that is no sequence classifier are
environment checks (`ftune.plan.checks.environment`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator

from pydantic import ValidationError

from ftune.errors import Problem
from ftune.recipe.objectives import family_of, objective, rl_setting
from ftune.recipe.rules import Rule
from ftune.recipe.schema import Recipe


def argument_problems(kind: str, name: str, model, args: dict, at: str, besides: str,
                      documented: str) -> Iterator[Problem]:
    """A named entry's arguments (a reward's, a tool's) checked against its arguments model, each problem at its
    key; an entry without a model (a plugin's) takes none."""
    if model is None:
        for key in args:
            yield Problem.at(f"{at}.{key}", f"{kind} '{name}' takes no arguments",
                             f"remove it (besides {besides}); see {documented}'s documentation")
        return
    try:
        model.model_validate(args)
    except ValidationError as err:
        for e in err.errors():
            key = ".".join(str(p) for p in e["loc"])
            msg = e["msg"] if e["type"] != "extra_forbidden" else "unknown argument"
            fields = ", ".join(model.model_fields) or "none"
            yield Problem.at(f"{at}.{key}" if key else at, f"{kind} '{name}': {msg}",
                             f"its arguments: {fields} (besides {besides}); see {documented}'s documentation")


def rl_section(recipe: Recipe) -> Iterator[Problem]:
    t = recipe.train
    if not family_of(recipe).generates:
        if t.rl is not None:
            yield Problem.at("train.rl", f"train.rl sets online RL options, but train.objective is '{t.objective}'",
                             "set `train.objective: grpo` (or rloo), or remove train.rl")
        return
    obj = objective(t.objective)
    if t.rl is None or not t.rl.rewards:
        yield Problem.at("train.rl" if t.rl is None else "train.rl.rewards",
                         f"{obj.name} learns from rewards, and the recipe names none",
                         "add `train.rl.rewards: [{name: exact_match}]` (or numeric, contains, regex, ...)")
        return
    for key in sorted(t.rl.model_fields_set):
        if key not in obj.settings:
            yield Problem.at(f"train.rl.{key}", f"{obj.name} has no `{key}` setting (grpo only)",
                             f"remove it; {obj.name} takes: {', '.join(obj.settings)}")


def rewards_known(recipe: Recipe) -> Iterator[Problem]:
    from ftune.rewards import available, where

    rl = recipe.train.rl
    if not family_of(recipe).generates or rl is None:
        return
    known = available()
    seen: set[str] = set()
    for i, spec in enumerate(rl.rewards):
        at = f"train.rl.rewards.{i}"
        reward = known.get(spec.name)
        if reward is None:
            close = difflib.get_close_matches(spec.name, list(known), n=3, cutoff=0.5)
            yield Problem.at(f"{at}.name", f"no reward named '{spec.name}'",
                             (f"did you mean {', '.join(repr(c) for c in close)}? " if close else "")
                             + f"rewards: {', '.join(sorted(known))} (more only through installed plugins)")
            continue
        if spec.name in seen:
            yield Problem.at(f"{at}.name", f"reward '{spec.name}' is named twice; its metrics would merge",
                             "give it once (its weight sets how much it counts)")
        seen.add(spec.name)
        yield from argument_problems("reward", spec.name, reward.args, spec.args, at, "name and weight",
                                     where(spec.name))
    if rl.rewards and all(spec.weight == 0 for spec in rl.rewards):
        last = len(rl.rewards) - 1
        yield Problem.at(f"train.rl.rewards.{last}.weight",
                         f"every reward has weight 0 ({'the only reward' if not last else 'all of them'}), so every "
                         "completion's total reward is 0: every advantage is zero and nothing is learned",
                         "give a reward a non-zero weight (the default is 1)")


def whole_groups(recipe: Recipe) -> Iterator[Problem]:
    """TRL samples `num_generations` completions per prompt in every generation batch (per-device batch x
    accumulation x processes completions): the batch must hold whole groups."""
    t, rl = recipe.train, recipe.train.rl
    if not family_of(recipe).generates or rl is None or not rl.rewards or t.per_device_batch_size == "auto":
        return  # auto is refused for these objectives (rules.train.batch_sizes_fit)
    n = recipe.distributed.num_processes
    world = (n if isinstance(n, int) else 1) * recipe.distributed.num_machines
    batch = t.global_batch_size or t.per_device_batch_size * t.gradient_accumulation_steps * world
    groups = rl_setting(recipe, "num_generations")
    if batch % groups:
        fits = [g for g in range(2, batch + 1) if batch % g == 0]
        yield Problem.at("train.rl.num_generations",
                         f"{groups} generations per prompt don't divide the generation batch of {batch} "
                         + ("completions (train.global_batch_size)" if t.global_batch_size else
                            f"completions (per_device_batch_size {t.per_device_batch_size} x "
                            f"gradient_accumulation_steps {t.gradient_accumulation_steps} x {world} "
                            f"process{'es' if world > 1 else ''})"),
                         f"use num_generations {', '.join(map(str, fits)) or '(none fits: raise the batch)'}, or make "
                         f"the batch a multiple of {groups}")
    d = recipe.data
    if d.max_prompt_length is not None and d.max_seq_length is not None \
            and d.max_prompt_length + rl.max_completion_length > d.max_seq_length:
        yield Problem.at("train.rl.max_completion_length",
                         f"data.max_prompt_length ({d.max_prompt_length}) + max_completion_length "
                         f"({rl.max_completion_length}) is longer than data.max_seq_length ({d.max_seq_length})",
                         "lower one of them, or raise data.max_seq_length")
    if rl.generation.backend == "vllm" and not recipe.peft.vllm_loads:
        yield Problem.at("train.rl.generation.backend", f"vLLM can't load a {recipe.peft.method} adapter",
                         "use `backend: transformers`, or peft.method lora")
    yield from paged_backend(recipe)


PAGED_ATTENTION = ("sdpa", "eager", "flash_attention_2")
"""What transformers' continuous batching attends with (eager runs as its `paged|eager`); flex_attention is not."""


def paged_backend(recipe: Recipe) -> Iterator[Problem]:
    """`backend: paged` where transformers' continuous batching can't run it, and vLLM's keys under another backend
    (they would be silently ignored). The model's own layer types are checked on the meta model (plan.preflight)."""
    g = recipe.train.rl.generation
    for key in sorted(k for k in g.model_fields_set if k.startswith("vllm_")):
        if g.backend != "vllm":
            yield Problem.at(f"train.rl.generation.{key}", f"{key} sets vLLM, and backend is {g.backend}",
                             "remove it, or set `backend: vllm`")
    if g.backend != "paged":
        return
    if not recipe.peft.paged_generates:
        yield Problem.at("train.rl.generation.backend", f"continuous batching (backend paged) keeps its own KV cache, "
                         f"which has no room for {recipe.peft.method}'s prefix key/values or adaption prompts",
                         "use `backend: transformers` with this method, or peft.method lora")
    attn = recipe.model.attn_implementation
    if attn is not None and attn not in PAGED_ATTENTION:
        yield Problem.at("train.rl.generation.backend", f"continuous batching (backend paged) attends with sdpa, "
                         f"eager or flash attention, and model.attn_implementation is {attn}",
                         "set `model.attn_implementation: sdpa` (or eager), or use `backend: transformers`")
    if recipe.model.task == "image-text-to-text":
        yield Problem.at("train.rl.generation.backend", "continuous batching (backend paged) generates from text "
                         "models only (TRL refuses a processor's images)", "use `backend: transformers`")


def reference_buildable(recipe: Recipe) -> Iterator[Problem]:
    """beta > 0 scores a reference: the disabled adapter (PEFT methods) or a frozen copy loaded from model.path
    (full, freeze), which a randomly initialised model doesn't have."""
    t = recipe.train
    if not family_of(recipe).generates or t.rl is None:
        return
    beta = rl_setting(recipe, "beta")
    if beta == 0:
        return
    if not recipe.peft.uses_peft_library and recipe.model.init == "random":
        yield Problem.at("train.rl.beta", f"beta {beta} scores a reference model, and with "
                         f"peft.method {recipe.peft.method} it is a frozen copy loaded from model.path; "
                         "`model.init: random` has no weights to load",
                         "set `train.rl.beta: 0`, or start from saved weights (model.init: pretrained)")


def head_not_adapted(recipe: Recipe) -> Iterator[Problem]:
    """TRL's online trainers compute the log-probabilities from the output head's weight directly, so an adapter
    on it would never train (TRL refuses it at init, after launch): refused here, at the key."""
    targets = getattr(recipe.peft, "target_modules", None)
    if not family_of(recipe).generates or not isinstance(targets, list):
        return
    for i, name in enumerate(targets):
        if name.rsplit(".", 1)[-1] == "lm_head":
            yield Problem.at(f"peft.target_modules.{i}", f"{recipe.train.objective} computes the log-probabilities "
                             "from lm_head's weight directly (TRL), so an adapter on lm_head would never be trained",
                             "remove lm_head from peft.target_modules (`all-linear` adapts every layer but the head)")


TOKEN_SUM_LOSSES = ("bnpo", "dr_grpo", "dapo", "cispo")
"""TRL's losses that sum per-token terms: under sequence-level ratios they weight each sequence by its length."""


def ratio_settings(recipe: Recipe) -> Iterator[Problem]:
    """The clipping bounds in order, and GSPO's sequence-level ratio only with the losses that optimise it (TRL
    1.16 only warns, then trains a length-weighted objective the recipe didn't ask for)."""
    rl = recipe.train.rl
    if not family_of(recipe).generates or rl is None:
        return
    if rl.epsilon_high is not None and rl.epsilon_high < rl.epsilon:
        yield Problem.at("train.rl.epsilon_high", f"epsilon_high {rl.epsilon_high} is below epsilon {rl.epsilon}: "
                         "the upper clipping range can't be narrower than the lower", "raise it (DAPO uses 0.28 "
                         "with epsilon 0.2), or remove it")
    if rl.delta is not None and rl.delta <= 1 + rl.epsilon:
        yield Problem.at("train.rl.delta", f"delta {rl.delta} is not above 1 + epsilon ({1 + rl.epsilon:g}): it "
                         "would clip the ratio inside the trust region", "set it above 1 + epsilon (e.g. 4), or "
                         "remove it")
    level, loss = rl.importance_sampling_level, rl.loss_type
    if level == "sequence" and loss in TOKEN_SUM_LOSSES:
        yield Problem.at("train.rl.loss_type", f"loss_type {loss} sums per-token terms, so with "
                         "importance_sampling_level: sequence (GSPO) each sequence weighs by its length instead of "
                         "the per-sequence objective", "use `loss_type: grpo` (GSPO's), or luspo, sapo; or remove "
                         "loss_type (ftune then uses grpo)")
    if level == "sequence" and loss == "vespo":
        yield Problem.at("train.rl.importance_sampling_level", "vespo computes its sequence-level weights itself "
                         "from token ratios", "remove importance_sampling_level (token) for vespo")
    if level == "token" and loss == "luspo":
        yield Problem.at("train.rl.importance_sampling_level", "luspo is defined on sequence-level ratios",
                         "set `importance_sampling_level: sequence` (or remove it: luspo then uses sequence)")


RULES: list[Rule] = [rl_section, rewards_known, whole_groups, reference_buildable, head_not_adapted, ratio_settings]
