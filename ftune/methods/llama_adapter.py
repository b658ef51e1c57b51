"""LLaMA-Adapter: zero-init gated adaption prompts on the top layers (peft.AdaptionPromptConfig)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from ftune.methods._base import MethodConfig


class Config(MethodConfig):
    method: Literal["llama-adapter"] = "llama-adapter"
    """LLaMA-Adapter (adaption prompts)."""
    adapter_len: int = Field(10, gt=0)
    """Number of adaption prompt tokens per adapted layer."""
    adapter_layers: int | None = Field(None, gt=0)
    """How many of the top layers get adaption prompts; default: all layers."""
    trains_new_token_rows: ClassVar[bool] = False

    def trained_names(self, model) -> list[str]:
        return [n.removeprefix("base_model.model.") for n, m in model.named_modules()
                if type(m).__name__ == "AdaptedAttention"]


PEFT_TYPE = "ADAPTION_PROMPT"


def from_adapter(config: dict) -> dict:
    """The `peft:` keys a saved LLaMA-Adapter's adapter_config.json fixes."""
    return {"adapter_len": config.get("adapter_len"), "adapter_layers": config.get("adapter_layers")}


def inject(model, cfg: Config, task: str):
    from peft import AdaptionPromptConfig, get_peft_model

    layers = cfg.adapter_layers or model.config.num_hidden_layers
    config = AdaptionPromptConfig(adapter_len=cfg.adapter_len, adapter_layers=layers, task_type="CAUSAL_LM")
    return get_peft_model(model, config)
