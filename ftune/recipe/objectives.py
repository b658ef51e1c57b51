"""The training objectives: which TRL trainer runs each, the data it reads and the settings it takes.

One table, read by the recipe rules (what is refused), the compiler (the config kwargs and class names in the
Plan) and the worker (which trainer to build). Light: names only; nothing here imports trl.
"""

from __future__ import annotations

from dataclasses import dataclass

TRL_PACKAGE = "trl"
TRL_INSTALL = "pip install 'ftune[preference]'"

# TRL's DPOConfig.loss_type values (trl 1.16); a list of several is a weighted mix, one name is enough here.
DPO_LOSSES = ("sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
              "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm")
KTO_LOSSES = ("kto", "apo_zero_unpaired")
KTO_KL_LOSSES = ("kto",)
"""The KTO losses that estimate a KL term from mismatched completions in the batch (TRL: sequential sampling, a
per-device batch of 2 or more)."""


RL_COMMON = ("rewards", "num_generations", "max_completion_length", "temperature", "top_p", "beta", "epsilon",
             "num_iterations", "generation", "guard_logs", "completions_sample", "reward_timeout")
"""The `train.rl` keys both online RL objectives take."""


@dataclass(frozen=True)
class Objective:
    """How one `train.objective` runs."""

    name: str
    module: str
    """The module both classes are imported from."""
    config_class: str
    """A TrainingArguments subclass; `plan.trainer` holds its exact kwargs."""
    trainer_class: str
    data_format: str | None
    """The `data.*.format` every source must have (None: any SFT format)."""
    settings: tuple[str, ...]
    """The `train.preference` (online RL: `train.rl`) keys this objective uses; the others are refused."""
    loss_types: tuple[str, ...] = ()
    uses_reference: bool = False
    """Whether a reference model is scored (dpo, kto); orpo and simpo are reference-free."""

    @property
    def config_path(self) -> str:
        return f"{self.module}.{self.config_class}"

    @property
    def trainer_path(self) -> str:
        return f"{self.module}.{self.trainer_class}"

    @property
    def needs_trl(self) -> bool:
        return self.module.split(".")[0] == TRL_PACKAGE


OBJECTIVES: dict[str, Objective] = {
    o.name: o
    for o in (
        Objective("sft", "transformers", "TrainingArguments", "Trainer", None, ()),
        Objective("dpo", "trl", "DPOConfig", "DPOTrainer", "preference",
                  ("beta", "loss_type", "label_smoothing", "reference"), DPO_LOSSES, uses_reference=True),
        Objective("orpo", "trl.experimental.orpo", "ORPOConfig", "ORPOTrainer", "preference", ("beta",)),
        Objective("kto", "trl", "KTOConfig", "KTOTrainer", "unpaired-preference",
                  ("beta", "loss_type", "reference", "desirable_weight", "undesirable_weight"), KTO_LOSSES,
                  uses_reference=True),
        # SimPO is TRL's CPO trainer with loss_type=simpo and no behaviour-cloning term (cpo_alpha=0)
        Objective("simpo", "trl.experimental.cpo", "CPOConfig", "CPOTrainer", "preference",
                  ("beta", "label_smoothing", "gamma")),
        # a reward model: a one-logit sequence classifier scored pairwise (chosen above rejected)
        Objective("reward", "trl", "RewardConfig", "RewardTrainer", "preference", ()),
        # online RL: `settings` are the train.rl keys
        Objective("grpo", "trl", "GRPOConfig", "GRPOTrainer", "prompt", RL_COMMON + ("loss_type", "scale_rewards")),
        Objective("rloo", "trl", "RLOOConfig", "RLOOTrainer", "prompt", RL_COMMON),
    )
}
RL_OBJECTIVES = ("grpo", "rloo")
RL_DEFAULTS = {"grpo": {"num_generations": 8, "beta": 0.0}, "rloo": {"num_generations": 2, "beta": 0.05}}
"""TRL 1.16's defaults where GRPOConfig and RLOOConfig differ (the recipe leaves them unset)."""


def rl_setting(recipe, key: str):
    """`train.rl.<key>` as the run uses it: the recipe's value, else TRL's default for the objective."""
    value = getattr(recipe.train.rl, key, None) if recipe.train.rl is not None else None
    return RL_DEFAULTS[recipe.train.objective][key] if value is None else value

PREFERENCE_FORMATS = ("preference", "unpaired-preference")


def preference_data(recipe) -> bool:
    """Whether the recipe trains on preference rows (TRL tokenizes and batches them); the rules make every source
    agree with `train.objective`, so the first one tells."""
    return recipe.data.train[0].format in PREFERENCE_FORMATS


def rl_data(recipe) -> bool:
    """Whether the recipe trains by online RL on prompt rows (the completions are generated during training)."""
    return recipe.train.objective in RL_OBJECTIVES


def objective(name: str) -> Objective:
    return OBJECTIVES[name]
