"""The online RL objectives' part of `plan.trainer`: the exact extra kwargs of TRL's GRPOConfig / RLOOConfig.

Every value TRL would otherwise default (generations, lengths, sampling, beta, clipping) is written out, so
`ftune plan --format json` shows what will run. Light: no trl import.
"""

from __future__ import annotations

from typing import Any

from ftune.plan import paged
from ftune.recipe.objectives import family_of, rl_setting
from ftune.recipe.schema import Recipe

GRPO_LOSS = "dapo"
SEQUENCE_LOSS = "grpo"
"""GSPO (`importance_sampling_level: sequence`) optimises one ratio per sequence: TRL's losses that sum token terms
(bnpo, dr_grpo, dapo, cispo) would weight each sequence by its length, so ftune's default there is grpo."""
GRPO_SCALE = "group"


def config_kwargs(recipe: Recipe) -> dict[str, Any]:
    """`train.objective` + `train.rl` → GRPOConfig/RLOOConfig's own kwargs ({} for the other objectives)."""
    name = recipe.train.objective
    rl = recipe.train.rl
    if not family_of(recipe).generates or rl is None:
        return {}
    out: dict[str, Any] = {
        "num_generations": rl_setting(recipe, "num_generations"),
        "max_completion_length": rl.max_completion_length,
        "temperature": rl.temperature,
        "top_p": rl.top_p,
        "beta": rl_setting(recipe, "beta"),
        "epsilon": rl.epsilon,
        "num_iterations": rl.num_iterations,
        "reward_weights": [r.weight for r in rl.rewards],
        # the rewards read the rows' other columns (answer, ...): TRL's default, written out
        "remove_unused_columns": False,
        "use_vllm": rl.generation.backend == "vllm",
        "log_completions": False,  # ftune writes completions.jsonl itself (TRL's needs pandas/rich tables)
    }
    if rl.generation.backend == "paged":  # TRL's in-process continuous batching, its cache sized by the Plan
        out |= {"use_transformers_continuous_batching": True,
                "transformers_continuous_batching_config": paged.generation_batch(recipe).continuous_batching_config()}
    if rl.generation.backend == "vllm":
        out |= {"vllm_mode": rl.generation.vllm_mode,
                "vllm_gpu_memory_utilization": rl.generation.vllm_gpu_memory_utilization}
    out |= {"epsilon_high": rl.epsilon_high if rl.epsilon_high is not None else rl.epsilon,
            "mask_truncated_completions": rl.mask_truncated_completions}
    if name == "grpo":
        level = rl.importance_sampling_level or ("sequence" if rl.loss_type == "luspo" else "token")
        out |= {"loss_type": rl.loss_type or (SEQUENCE_LOSS if level == "sequence" else GRPO_LOSS),
                "scale_rewards": rl.scale_rewards or GRPO_SCALE, "importance_sampling_level": level,
                "delta": rl.delta, "top_entropy_quantile": rl.top_entropy_quantile}
        if rl.tools:  # TRL runs the tool loop (ftune.runtime.tools); None would be unbounded
            out["max_tool_calling_iterations"] = rl.max_tool_calls
    return out


def generation_batch(recipe: Recipe, world_size: int) -> tuple[int, int]:
    """(prompts, completions) sampled per optimizer step: the per-device batch counts completions."""
    t = recipe.train
    completions = t.per_device_batch_size * t.gradient_accumulation_steps * world_size
    return completions // rl_setting(recipe, "num_generations"), completions


def notes(recipe: Recipe, world_size: int, continued: bool) -> list[str]:
    """What an RL run does per step and what its reference costs, for `plan.notes`."""
    if not family_of(recipe).generates or recipe.train.rl is None:
        return []
    rl = recipe.train.rl
    prompts, completions = generation_batch(recipe, world_size)
    out = [f"{recipe.train.objective}: each step samples {prompts} prompt(s) x {rl_setting(recipe, 'num_generations')} "
           f"completions ({completions} in all, up to {rl.max_completion_length} tokens each) with "
           f"{rl.generation.backend}, then scores them with {len(rl.rewards)} reward(s)"]
    if rl.generation.backend == "paged":
        out.append(f"{recipe.train.objective} paged KV cache per process: "
                   f"{paged.generation_batch(recipe).describe()} (transformers continuous batching)")
    if world_size > 1:
        out.append(split_note(recipe, world_size))
    beta = rl_setting(recipe, "beta")
    if beta == 0:
        out.append(f"{recipe.train.objective} reference: none (beta 0: no KL term, no reference model in memory)")
    elif recipe.peft.uses_peft_library:
        what = "the base without the continued adapter" if continued else "the base"
        out.append(f"{recipe.train.objective} reference (beta {beta}): {what}, scored with the adapter disabled "
                   "(no second copy in memory)")
    else:
        out.append(f"{recipe.train.objective} reference (beta {beta}): a frozen copy of the model loaded from "
                   "model.path (its weights once more in memory)")
    return out


def split_note(recipe: Recipe, world_size: int) -> str:
    """How the processes share a step's generation batch, and why a run on another process count agrees with this
    one only in distribution: TRL seeds each process's sampling with `seed + rank` (so no two draw alike), so the
    same recipe on 1 and on N processes samples different completions. On the same completions the updates are
    the same (measured: tests/e2e/test_rl.py, DDP and FSDP, equal to 1e-6)."""
    t = recipe.train
    groups = rl_setting(recipe, "num_generations")
    each = t.per_device_batch_size * t.gradient_accumulation_steps
    whole = (f"{each // groups} whole prompt group(s) each" if each % groups == 0
             else "groups spanning processes")
    return (f"{recipe.train.objective} on {world_size} processes: each generates {each} of the step's "
            f"{each * world_size} completions ({whole}); rewards are gathered from every process before the group "
            "advantages. Each process samples with its own seed (train.seed + rank), so curves match a run on "
            "another number of processes statistically, not step for step")
