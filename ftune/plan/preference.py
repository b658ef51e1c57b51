"""The preference objectives' part of `plan.trainer`: the exact extra kwargs of TRL's config classes.

DPOConfig, KTOConfig, ORPOConfig and CPOConfig subclass TrainingArguments, so `plan.trainer` is their kwargs:
the TrainingArguments ones (`ftune.plan.trainer`) plus these. Every value TRL would otherwise default is written
out (beta, loss, lengths, dropout), so `ftune plan --format json` shows what will run. Light: no trl import.
"""

from __future__ import annotations

from typing import Any

from ftune.recipe.objectives import KTO_KL_LOSSES, family_of, objective
from ftune.recipe.schema import Recipe

SIMPO_BETA = 2.0  # the SimPO paper's range is 2.0-2.5; TRL's CPOConfig default (0.1) is CPO's
SIMPO_GAMMA = 0.5
TRL_BETA = 0.1


def config_kwargs(recipe: Recipe) -> dict[str, Any]:
    """`train.objective` + `train.preference` + the data lengths → the TRL config's own kwargs ({} for sft and online RL)."""
    name = recipe.train.objective
    if objective(name).data_format not in ("preference", "unpaired-preference"):
        return {}  # sft; online RL: ftune.plan.rl
    p = recipe.train.preference
    get = (lambda key, default: default if p is None or getattr(p, key) is None else getattr(p, key))
    out: dict[str, Any] = {
        # prompt + completion, truncated at the end; None: no truncation, as for SFT
        "max_length": recipe.data.max_seq_length,
        # the policy and the reference must see the same network: TRL's default, written out
        "disable_dropout": True,
        "dataset_num_proc": recipe.data.num_proc,
    }
    if name == "dpo":
        out |= {"beta": get("beta", TRL_BETA), "loss_type": [get("loss_type", "sigmoid")],
                "label_smoothing": get("label_smoothing", 0.0),
                "precompute_ref_log_probs": get("reference", "model") == "precomputed"}
    elif name == "kto":
        loss = get("loss_type", "kto")
        out |= {"beta": get("beta", TRL_BETA), "loss_type": loss,
                "desirable_weight": get("desirable_weight", 1.0), "undesirable_weight": get("undesirable_weight", 1.0),
                "precompute_ref_log_probs": get("reference", "model") == "precomputed"}
        if loss in KTO_KL_LOSSES:  # TRL pairs each row with its batch neighbour's completion for the KL estimate:
            out["train_sampling_strategy"] = "sequential"  # a fixed order (the data stage has shuffled the rows)
    elif name == "orpo":
        out |= {"beta": get("beta", TRL_BETA)}
    elif name == "simpo":
        out |= {"loss_type": "simpo", "cpo_alpha": 0.0, "beta": get("beta", SIMPO_BETA),
                "simpo_gamma": get("gamma", SIMPO_GAMMA), "label_smoothing": get("label_smoothing", 0.0)}
    return out


def reference_copy(recipe: Recipe) -> bool:
    """Whether training holds a frozen copy of the model as the reference (dpo and kto with full fine-tuning, the
    reference scored during training; grpo and rloo with beta > 0): the weights once more in memory, which
    `ftune plan` counts."""
    from ftune.recipe.objectives import rl_setting

    if family_of(recipe).generates:
        return recipe.train.rl is not None and rl_setting(recipe, "beta") > 0 and not recipe.peft.uses_peft_library
    p = recipe.train.preference
    return (objective(recipe.train.objective).uses_reference and not recipe.peft.uses_peft_library
            and not (p is not None and p.reference == "precomputed"))


LOW_PRECISION = {"bf16": "bfloat16", "fp16": "float16"}


def fsdp_mixed_precision(recipe: Recipe, mixed_precision: str) -> dict[str, str | None] | None:
    """FSDP2's MixedPrecisionPolicy for a preference objective in bf16/fp16 (None: accelerate's own policy).

    accelerate casts the model's outputs to the low precision as well (`output_dtype`), and for DPO/KTO the outputs
    are TRL's float32 per-token log-probs: each sequence's summed log-prob was rounded to bf16 (steps of 0.25 at -50,
    of 2 at -500) before the reference's was subtracted, so losses and rewards moved in steps (measured on 2 CPU
    processes: log 2 logged as 0.6914, a margin of 0.0548 as 0.0625). The outputs are left as computed; the
    parameters still compute, and the gradients reduce, in the low precision, as accelerate sets them."""
    d = recipe.distributed
    if (not family_of(recipe).on_trl or mixed_precision not in LOW_PRECISION or d.strategy != "fsdp"
            or (d.fsdp is not None and d.fsdp.version != 2)):
        return None
    low = LOW_PRECISION[mixed_precision]
    return {"param_dtype": low, "reduce_dtype": low, "output_dtype": None}


def reference_note(recipe: Recipe, continued: bool = False) -> str | None:
    """What the reference model costs, for `plan.notes` (None for sft and the reference-free objectives);
    `continued`: the adapter being trained is a saved one (model.path at it), not a fresh one."""
    obj = objective(recipe.train.objective)
    if not obj.uses_reference:
        return None
    p = recipe.train.preference
    if p is not None and p.reference == "precomputed":
        return (f"{obj.name} reference: log-probs precomputed once before training (one extra pass over the data); "
                "no reference model is kept in memory")
    if continued:
        return (f"{obj.name} reference: the adapter being continued, as it starts (a frozen copy of the adapter "
                "alone, not of the model)")
    if recipe.peft.uses_peft_library:
        return f"{obj.name} reference: the base model with the adapter disabled (no second copy in memory)"
    return (f"{obj.name} reference: a frozen copy of the model (its weights once more in memory); "
            "`train.preference.reference: precomputed` avoids it")
