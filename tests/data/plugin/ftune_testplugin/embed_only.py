"""A PEFT method: train the input embeddings only (a full model is saved)."""

from typing import Literal

from ftune.methods import MethodConfig


class Config(MethodConfig):
    method: Literal["embed-only"]

    @property
    def uses_peft_library(self) -> bool:
        return False


def inject(model, cfg, task):
    for name, p in model.named_parameters():
        p.requires_grad_("embed_tokens" in name)
    return model
