"""Full fine-tuning: every parameter trains; the output is a whole model."""

from __future__ import annotations

from typing import ClassVar, Literal

from ftune.methods._base import MethodConfig


class Config(MethodConfig):
    method: Literal["full"] = "full"
    """Full fine-tuning: all parameters are trained."""
    trains_vision_models: ClassVar[bool] = True
    vllm_loads: ClassVar[bool] = True

    @property
    def uses_peft_library(self) -> bool:
        return False

    @property
    def trains_whole_model(self) -> bool:
        return True


def inject(model, cfg: Config, task: str):
    for p in model.parameters():
        p.requires_grad_(True)
    return model
