"""LoRA: low-rank adapters on chosen linear layers (peft.LoraConfig)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ftune.methods._base import MethodConfig


class Config(MethodConfig):
    method: Literal["lora"] = "lora"
    """Low-rank adaptation (LoRA)."""
    r: int = 8
    """LoRA rank: the inner dimension of the A·B update. Must be > 0; 8-64 is typical."""
    alpha: float = 16
    """LoRA scaling numerator; the update is scaled by alpha / r (alpha / sqrt(r) with use_rslora)."""
    dropout: float = Field(0.05, ge=0.0, lt=1.0)
    """Dropout on the LoRA input, in [0, 1)."""
    target_modules: list[str] | Literal["all-linear"] = Field(default_factory=lambda: ["q_proj", "v_proj"])
    """Module names (or name suffixes) to adapt, or `all-linear` for every linear layer but the head."""
    modules_to_save: list[str] | None = None
    """Extra modules trained in full and saved with the adapter (e.g. `score` for classification)."""
    bias: Literal["none", "all", "lora_only"] = "none"
    """Which biases to train."""
    use_rslora: bool = False
    """Rank-stabilised LoRA: scale by alpha / sqrt(r)."""
    use_dora: bool = False
    """Weight-decomposed LoRA (DoRA)."""

    @property
    def merge(self) -> str | None:
        return "merge"


def inject(model, cfg: Config, task: str):
    from peft import LoraConfig, get_peft_model

    task_type = "SEQ_CLS" if task == "sequence-classification" else "CAUSAL_LM"
    target = cfg.target_modules if isinstance(cfg.target_modules, str) else list(cfg.target_modules)
    config = LoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=target,
        modules_to_save=list(cfg.modules_to_save) if cfg.modules_to_save else None,
        bias=cfg.bias,
        use_rslora=cfg.use_rslora,
        use_dora=cfg.use_dora,
        task_type=task_type,
    )
    return get_peft_model(model, config)
