"""Prefix tuning: trained virtual key/value tokens prepended at every layer (peft.PrefixTuningConfig)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from ftune.errors import Problem
from ftune.methods._base import MethodConfig


class Config(MethodConfig):
    method: Literal["prefix"] = "prefix"
    """Prefix tuning."""
    num_virtual_tokens: int = Field(20, gt=0)
    """Number of virtual prefix tokens per layer."""
    prefix_projection: bool = False
    """Reparameterise the prefix through a small MLP (more parameters, often more stable)."""
    trains_new_token_rows: ClassVar[bool] = False

    def problems(self, recipe) -> list[Problem]:
        if not recipe.data.packing:
            return []
        return [Problem.at("data.packing", "packing can't be combined with prefix tuning: the prefix is fed as a KV "
                           "cache, which turns off the packed-sample detection that keeps samples from attending to "
                           "each other", "set `data.packing: false`, or use `peft.method: lora`")]

    def trained_names(self, model) -> list[str]:
        return [f"{self.num_virtual_tokens} virtual tokens x {model.config.num_hidden_layers} layers (keys, values)"]


PEFT_TYPE = "PREFIX_TUNING"


def from_adapter(config: dict) -> dict:
    """The `peft:` keys a saved prefix-tuning adapter's adapter_config.json fixes."""
    return {"num_virtual_tokens": config.get("num_virtual_tokens"),
            "prefix_projection": config.get("prefix_projection")}


def inject(model, cfg: Config, task: str):
    from peft import PrefixTuningConfig, get_peft_model

    task_type = "SEQ_CLS" if task == "sequence-classification" else "CAUSAL_LM"
    config = PrefixTuningConfig(
        num_virtual_tokens=cfg.num_virtual_tokens,
        prefix_projection=cfg.prefix_projection,
        task_type=task_type,
    )
    return get_peft_model(model, config)
