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
    """The `train.preference` keys this objective uses; the others are refused."""
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
    )
}

PREFERENCE_FORMATS = ("preference", "unpaired-preference")


def preference_data(recipe) -> bool:
    """Whether the recipe trains on preference rows (TRL tokenizes and batches them); the rules make every source
    agree with `train.objective`, so the first one tells."""
    return recipe.data.train[0].format in PREFERENCE_FORMATS


def objective(name: str) -> Objective:
    return OBJECTIVES[name]
