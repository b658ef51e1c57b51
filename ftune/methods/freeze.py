"""Partial fine-tuning: only parameters whose names match `trainable` regexes train."""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import Field, field_validator

from ftune.methods._base import MethodConfig


class Config(MethodConfig):
    method: Literal["freeze"] = "freeze"
    """Partial fine-tuning: everything frozen except `trainable`."""
    trainable: list[str] = Field(min_length=1)
    """Regular expressions searched in parameter names (e.g. `layers\\.3[01]\\.`, `lm_head`); matches train."""
    vllm_loads: ClassVar[bool] = True
    paged_generates: ClassVar[bool] = True
    inject_errors_at: ClassVar[str] = "peft.trainable"
    experts_hint: ClassVar[str] = "name them in peft.trainable (e.g. `mlp\\.experts\\.`)"

    def trained_names(self, model) -> list[str]:
        return [n for n, p in model.named_parameters() if p.requires_grad]

    @field_validator("trainable")
    @classmethod
    def _regexes_compile(cls, v: list[str]) -> list[str]:
        for pattern in v:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"invalid regular expression {pattern!r}: {e}") from None
        return v

    @property
    def uses_peft_library(self) -> bool:
        return False


def trainable_names(names: list[str], cfg: Config) -> list[str]:
    patterns = [re.compile(p) for p in cfg.trainable]
    return [n for n in names if any(p.search(n) for p in patterns)]


def inject(model, cfg: Config, task: str):
    names = [n for n, _ in model.named_parameters()]
    keep = set(trainable_names(names, cfg))
    if not keep:
        from ftune.errors import FtuneError

        sample = ", ".join(names[:6] + ["..."] + names[-3:])
        raise FtuneError(
            f"peft.trainable matches no parameter of the model ({len(names)} parameters)",
            hint=f"parameter names look like: {sample}",
        )
    for n, p in model.named_parameters():
        p.requires_grad_(n in keep)
    return model
