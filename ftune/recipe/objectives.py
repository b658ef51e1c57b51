"""The training objectives: which TRL trainer runs each, the data it reads and the settings it takes.

One table, read by the recipe rules (what is refused), the compiler (the config kwargs and class names in the
Plan) and the worker (which trainer to build). Each objective belongs to a `Family` (sft, preference, reward, rl,
distill)
that owns its data rows, its trainer builder and what the rest of the code asks of it; plugins add objectives to a
family. Light: names only; nothing here imports trl.
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


DISTILL_SETTINGS = ("teacher", "loss", "beta", "on_policy", "teacher_sequences", "temperature", "max_new_tokens",
                    "dtype")
"""The `train.distill` keys."""
DISTILL_BETA = {"forward_kl": 0.0, "reverse_kl": 1.0}
"""`train.distill.loss` as GKD's beta (its generalized JSD is forward KL at 0, reverse KL at 1); jsd: `beta`."""
DISTILL_JSD_BETA = 0.5

RL_COMMON = ("rewards", "num_generations", "max_completion_length", "temperature", "top_p", "beta", "epsilon",
             "epsilon_high", "mask_truncated_completions", "num_iterations", "generation", "guard_logs",
             "completions_sample", "reward_timeout")
"""The `train.rl` keys both online RL objectives take."""


@dataclass(frozen=True)
class Family:
    """A kind of training, owned whole: the rows its data stage builds, the function that builds its trainer and
    what the rest of ftune asks of it. Every objective belongs to one; the Plan names it (`Plan.family`), and the
    compiler, the data stage, the worker, `eval` and the estimator dispatch on it instead of comparing names."""

    name: str
    rows: str
    """The data stage's preprocessor (`ftune.datastage.build`): `sft` (tokenized, masked and packed by ftune),
    `preference` (pairs TRL tokenizes), `prompt` (prompts the trainer completes)."""
    trainer: str
    """'module:function' building the trainer: (plan, trainer_class, model, tokenizer, bundle, args, callbacks,
    ref_model) -> a transformers Trainer."""
    next_token_loss: bool = False
    """The loss is the mean next-token NLL (perplexity, streaming, VLMs, generation metrics can read it)."""
    on_trl: bool = False
    """Runs on a TRL trainer that scores sequences (its float32 outputs stay float32 under FSDP; rewards in the
    progress line)."""
    generates: bool = False
    """Online RL: completions are generated while training and scored by `train.rl.rewards`."""
    one_logit: bool = False
    """Trains a one-logit sequence classifier on preference pairs (a reward model)."""
    teacher: bool = False
    """Learns a frozen teacher model's next-token distributions (`train.distill`): the teacher's tokenizer must be
    the model's, and the plan counts its weights and forward passes."""


# Each family's own modules (where its objectives' names may be compared, for per-objective settings): preference
# and reward: plan/preference.py, recipe/rules/preference.py, dataset/preference.py, runtime/train.preference_trainer;
# rl: plan/rl.py, recipe/rules/rl.py, dataset/prompt.py, runtime/rl.py; sft: the data stage's pipeline and
# runtime/train.sft_trainer; distill: plan/distill.py, recipe/rules/distill.py, runtime/distill.py,
# estimate/teacher.py.
FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("sft", "sft", "ftune.runtime.train:sft_trainer", next_token_loss=True),
        Family("preference", "preference", "ftune.runtime.train:preference_trainer", on_trl=True),
        Family("reward", "preference", "ftune.runtime.train:preference_trainer", on_trl=True, one_logit=True),
        Family("rl", "prompt", "ftune.runtime.rl:build_trainer", on_trl=True, generates=True),
        # the sft rows (prompt masked) unpacked; TRL's GKD trainer scores them with the teacher
        Family("distill", "sft", "ftune.runtime.distill:build_trainer", teacher=True),
    )
}


@dataclass(frozen=True)
class Objective:
    """How one `train.objective` runs. A plugin registers one as `Plugin(objectives={name: Objective(...)})`, in
    one of the `FAMILIES`, naming its own config and trainer classes (docs/plugins.md)."""

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
    family: str = "sft"
    """The `FAMILIES` row this objective belongs to."""
    takes_images: bool = False
    """Its trainer takes image rows on a vision-language model (`VISION_FORMATS`: TRL 1.16's DPO and GRPO build
    the pixel inputs from an `images` column)."""

    @property
    def config_path(self) -> str:
        return f"{self.module}.{self.config_class}"

    @property
    def trainer_path(self) -> str:
        return f"{self.module}.{self.trainer_class}"

    @property
    def needs_trl(self) -> bool:
        return self.module.split(".")[0] == TRL_PACKAGE


TOOL_SETTINGS = ("tools", "max_tool_calls", "tool_error_reward", "tool_format", "tool_timeout")
"""GRPO's tool-calling keys (TRL's GRPOTrainer runs the tool loop; its RLOOTrainer has none)."""

OBJECTIVES: dict[str, Objective] = {
    o.name: o
    for o in (
        Objective("sft", "transformers", "TrainingArguments", "Trainer", None, (), takes_images=True),
        Objective("dpo", "trl", "DPOConfig", "DPOTrainer", "preference",
                  ("beta", "loss_type", "label_smoothing", "reference"), DPO_LOSSES, uses_reference=True,
                  family="preference", takes_images=True),
        Objective("orpo", "trl.experimental.orpo", "ORPOConfig", "ORPOTrainer", "preference", ("beta",),
                  family="preference"),
        Objective("kto", "trl", "KTOConfig", "KTOTrainer", "unpaired-preference",
                  ("beta", "loss_type", "reference", "desirable_weight", "undesirable_weight"), KTO_LOSSES,
                  uses_reference=True, family="preference"),
        # SimPO is TRL's CPO trainer with loss_type=simpo and no behaviour-cloning term (cpo_alpha=0)
        Objective("simpo", "trl.experimental.cpo", "CPOConfig", "CPOTrainer", "preference",
                  ("beta", "label_smoothing", "gamma"), family="preference"),
        # a reward model: a one-logit sequence classifier scored pairwise (chosen above rejected)
        Objective("reward", "trl", "RewardConfig", "RewardTrainer", "preference", (), family="reward"),
        # online RL: `settings` are the train.rl keys
        Objective("grpo", "trl", "GRPOConfig", "GRPOTrainer", "prompt", RL_COMMON + ("loss_type", "scale_rewards",
                                                                           "importance_sampling_level", "delta",
                                                                           "top_entropy_quantile")
                  + TOOL_SETTINGS,
                  family="rl", takes_images=True),
        Objective("rloo", "trl", "RLOOConfig", "RLOOTrainer", "prompt", RL_COMMON, family="rl"),
        # GKD (experimental in TRL 1.16) over the stable DistillationTrainer, which only trains on-policy, on
        # prompts: GKD mixes the data's completions with the student's own (lmbda) and takes the sft rows
        Objective("distill", "trl.experimental.gkd", "GKDConfig", "GKDTrainer", None, DISTILL_SETTINGS,
                  family="distill"),
    )
}
RL_DEFAULTS = {"grpo": {"num_generations": 8, "beta": 0.0}, "rloo": {"num_generations": 2, "beta": 0.05}}
"""TRL 1.16's defaults where GRPOConfig and RLOOConfig differ (the recipe leaves them unset)."""


def rl_setting(recipe, key: str):
    """`train.rl.<key>` as the run uses it: the recipe's value, else TRL's default for the objective."""
    value = getattr(recipe.train.rl, key, None) if recipe.train.rl is not None else None
    return RL_DEFAULTS[recipe.train.objective][key] if value is None else value

PREFERENCE_FORMATS = ("preference", "unpaired-preference")
VISION_FORMATS = {"vision-chat": "chat", "vision-preference": "preference", "vision-prompt": "prompt"}
"""The formats whose rows carry images (a vision-language model reads these only) -> the text format whose rows
they are otherwise: vision-chat trains sft, vision-preference the objectives reading `preference` rows,
vision-prompt those reading `prompt` rows."""


def text_format(fmt: str) -> str:
    """The text format a data format's rows are (itself for a text format): what an objective's `data_format`
    is compared with."""
    return VISION_FORMATS.get(fmt, fmt)


def vision_format(data_format: str | None) -> str | None:
    """The image-carrying format an objective reading `data_format` rows takes on a vision-language model (None:
    there is none, e.g. for unpaired preference rows)."""
    return next((v for v, t in VISION_FORMATS.items() if t == (data_format or "chat")), None)


def registered() -> dict[str, Objective]:
    """The built-in objectives, then the installed plugins' (`Plugin.objectives`; a built-in name can't be taken)."""
    from ftune.plugins import PluginError, installed, merged

    table = merged("objectives", OBJECTIVES)
    for name, o in table.items():
        if not isinstance(o, Objective) or o.family not in FAMILIES:
            raise PluginError(f"plugin {installed().versions.get(name, '')} registers objective '{name}' that is not "
                              f"an Objective of a known family", hint="register Objective(..., family=...) with a "
                              f"family of ftune.recipe.objectives.FAMILIES: {', '.join(FAMILIES)}")
    return table


def objective(name: str) -> Objective:
    return OBJECTIVES[name] if name in OBJECTIVES else registered()[name]


def family_of(recipe) -> Family:
    """The family `train.objective` belongs to (the compiler records its name as `Plan.family`)."""
    return FAMILIES[objective(recipe.train.objective).family]
