"""Rewards as data: `train.rl.rewards: [{name, weight, ...args}]` names a reward registered here or by a plugin.

Each reward is a `RewardPlugin`: a pydantic model of its arguments (validated at `ftune validate`, errors located
at the key) and the import string of a factory `make(args) -> score`, where `score(sample) -> float` scores one
completion. A `Sample` carries the prompt, the completion, its token ids, the row's `answer` and the row's other
columns. ftune calls `score` row by row, so a reward that raises or returns NaN is named with the row it failed on.
Light: pydantic only; the scoring code is imported in the worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ftune.patterns import backtracks
from ftune.plugins import RewardPlugin, installed, merged


@dataclass(frozen=True)
class Sample:
    """One completion to score, with its row."""

    prompt: str
    completion: str
    completion_ids: tuple[int, ...]
    answer: Any = None
    """The row's reference answer (the `answer` field), None where the data has none."""
    row: dict[str, Any] = field(default_factory=dict)
    """The row's other columns, as the data has them."""

    @property
    def completion_tokens(self) -> int:
        return len(self.completion_ids)


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NoArgs(Args):
    pass


class ContainsArgs(Args):
    text: str | None = None
    """Look for this text instead of the row's answer."""


class NumericArgs(Args):
    tolerance: float = Field(1e-6, ge=0.0)
    """Largest |last number - answer| that still scores 1."""


class RegexArgs(Args):
    pattern: str
    """A Python regular expression the completion must match."""
    full: bool = False
    """Match the whole (stripped) completion instead of searching in it."""

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        import re

        try:
            re.compile(v)
        except re.error as err:
            raise ValueError(f"not a regular expression: {err}") from None
        why = backtracks(v)
        if why is not None:
            raise ValueError(f"the pattern can backtrack catastrophically ({why}): Python's regex engine may then run "
                             "for hours on one completion; rewrite it so each character can be matched one way "
                             "only (e.g. `(a+)+` -> `a+`, `(.|.)*` -> `.*`)")
        return v


class ChoiceArgs(Args):
    choices: str = Field("ABCD", min_length=2, pattern=r"^[A-Za-z0-9]+$")
    """The option letters; the first of them standing alone in the completion is its choice."""


class JsonArgs(Args):
    required: list[str] = Field(default_factory=list)
    """Keys the parsed object must have."""


class LengthArgs(Args):
    target: int = Field(ge=1)
    """The completion length (tokens) that scores 0, the best."""
    penalty: float = Field(0.01, gt=0.0)
    """Reward lost per token away from the target."""


class RepetitionArgs(Args):
    ngram_size: int = Field(3, ge=1)
    max_penalty: float = Field(-1.0, le=0.0)


class OverlongArgs(Args):
    max_completion_len: int = Field(ge=1)
    soft_punish_cache: int = Field(ge=0)


class RewardModelArgs(Args):
    path: str
    """A sequence-classification model folder (one label): its logit is the reward (e.g. an `objective: reward`
    run's final/)."""


_B = "ftune.rewards.builtin"
BUILTIN: dict[str, RewardPlugin] = {
    "exact_match": RewardPlugin(f"{_B}:exact_match", NoArgs, needs_answer=True),
    "contains": RewardPlugin(f"{_B}:contains", ContainsArgs, needs_answer=True),
    "numeric": RewardPlugin(f"{_B}:numeric", NumericArgs, needs_answer=True),
    "regex": RewardPlugin(f"{_B}:regex", RegexArgs),
    "choice": RewardPlugin(f"{_B}:choice", ChoiceArgs, needs_answer=True),
    "json": RewardPlugin(f"{_B}:json_object", JsonArgs),
    "length": RewardPlugin(f"{_B}:length", LengthArgs),
    # TRL's built-ins (trl.rewards), by their names
    "think_format": RewardPlugin(f"{_B}:think_format", NoArgs),
    "repetition_penalty": RewardPlugin(f"{_B}:repetition_penalty", RepetitionArgs),
    "soft_overlong_punishment": RewardPlugin(f"{_B}:soft_overlong_punishment", OverlongArgs),
    # a trained sequence classifier: prompt + completion + eos scored in batches on the device (ftune.runtime.rl)
    "reward_model": RewardPlugin("", RewardModelArgs),
}
REWARD_MODEL = "reward_model"


@cache
def available() -> dict[str, RewardPlugin]:
    """The built-in rewards and the installed plugins'; a plugin may not take a built-in's name (`merged`)."""
    return merged("rewards", BUILTIN)


def where(name: str) -> str:
    """Who provides a reward, for messages."""
    return "ftune" if name in BUILTIN else installed().versions.get(name, "a plugin")
