"""Names transformers' Trainer accepts, kept here so `ftune validate` checks them without importing transformers.

Each table is compared with the installed transformers by a drift test (tests/unit/test_trainer_names.py),
so a transformers upgrade that adds or removes a name fails the suite instead of a user's run.
"""

from __future__ import annotations

OPTIMIZERS: tuple[str, ...] = (
    "adamw_torch", "adamw_torch_fused", "adamw_torch_xla", "adamw_torch_npu_fused", "adafactor",
    "adamw_anyprecision", "adamw_torch_4bit", "adamw_torch_8bit", "ademamix", "sgd", "adagrad", "adamw_bnb_8bit",
    "adamw_8bit", "ademamix_8bit", "lion_8bit", "lion_32bit", "paged_adamw_32bit", "paged_adamw_8bit",
    "paged_ademamix_32bit", "paged_ademamix_8bit", "paged_lion_32bit", "paged_lion_8bit", "rmsprop", "rmsprop_bnb",
    "rmsprop_bnb_8bit", "rmsprop_bnb_32bit", "galore_adamw", "galore_adamw_8bit", "galore_adafactor",
    "galore_adamw_layerwise", "galore_adamw_8bit_layerwise", "galore_adafactor_layerwise", "lomo", "adalomo",
    "grokadamw", "schedule_free_radam", "schedule_free_adamw", "schedule_free_sgd", "apollo_adamw",
    "apollo_adamw_layerwise", "stable_adamw",
)
"""transformers' `OptimizerNames` (5.23)."""

BNB_OPTIMIZERS = frozenset({
    "adamw_bnb_8bit", "adamw_8bit", "ademamix", "ademamix_8bit", "lion_8bit", "lion_32bit",
    "paged_adamw_32bit", "paged_adamw_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit",
    "paged_lion_32bit", "paged_lion_8bit", "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit",
})
"""Optimizers that run on bitsandbytes (its install is checked with the quantization checks)."""

OPTIONAL_OPTIMIZERS: dict[str, tuple[str, str]] = {
    "galore_": ("galore_torch", "galore-torch"),
    "apollo_": ("apollo_torch", "apollo-torch"),
    "lomo": ("lomo_optim", "lomo-optim"),
    "adalomo": ("lomo_optim", "lomo-optim"),
    "grokadamw": ("grokadamw", "grokadamw"),
    "schedule_free_": ("schedulefree", "schedulefree"),
    "adamw_torch_4bit": ("torchao", "torchao>=0.4"),
    "adamw_torch_8bit": ("torchao", "torchao>=0.4"),
    "stable_adamw": ("optimi", "torch-optimi"),
    "adamw_anyprecision": ("torchdistx", "torchdistx"),
}
"""Optimizer name prefix -> (import name, pip spec) of the package transformers needs for it."""

DEVICE_OPTIMIZERS: dict[str, str] = {"adamw_torch_xla": "an XLA device (TPU)", "adamw_torch_npu_fused": "an Ascend NPU"}
"""Optimizers that need hardware ftune does not run on."""

LOW_RANK_OPTIMIZERS = ("galore_", "apollo_")
"""Optimizers that project only `optimizer_args.target_modules` (transformers' optim_target_modules)."""

SCHEDULER_ARGS: dict[str, tuple[frozenset[str], tuple[frozenset[str], ...]]] = {
    # scheduler -> (keys it accepts, groups of keys of which exactly one is required)
    "linear": (frozenset(), ()),
    "constant": (frozenset(), ()),
    "constant_with_warmup": (frozenset(), ()),
    "cosine": (frozenset({"num_cycles"}), ()),
    "cosine_with_restarts": (frozenset({"num_cycles"}), ()),
    "polynomial": (frozenset({"lr_end", "power"}), ()),
    "inverse_sqrt": (frozenset({"timescale"}), ()),
    "reduce_lr_on_plateau": (frozenset({"mode", "factor", "patience", "threshold", "threshold_mode", "cooldown",
                                        "min_lr", "eps"}), ()),
    "cosine_with_min_lr": (frozenset({"num_cycles", "min_lr", "min_lr_rate"}), (frozenset({"min_lr", "min_lr_rate"}),)),
    "warmup_stable_decay": (frozenset({"num_decay_steps", "num_stable_steps", "warmup_type", "decay_type",
                                       "min_lr_ratio", "num_cycles"}), (frozenset({"num_decay_steps"}),)),
}
"""`train.lr_scheduler_args` keys per `train.lr_scheduler` (transformers' scheduler functions' keyword arguments)."""


def needs_package(optimizer: str) -> tuple[str, str] | None:
    """(import name, pip spec) of the optional package `optimizer` needs, or None."""
    for prefix, package in OPTIONAL_OPTIMIZERS.items():
        if optimizer.startswith(prefix):
            return package
    return None


def is_low_rank(optimizer: str) -> bool:
    return optimizer.startswith(LOW_RANK_OPTIMIZERS)
