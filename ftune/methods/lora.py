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
    init: Literal["default", "gaussian", "pissa", "olora", "loftq"] = "default"
    """Adapter initialisation (peft's init_lora_weights): `default` (B = 0), `gaussian`, `pissa` and `olora` (start
    from the weights' principal directions / a QR factor, moving them out of the base; the saved adapter is converted
    back to a plain LoRA on the original base, at twice the rank). `loftq` is refused: its adapter fits only the
    LoftQ-quantized base peft writes into the model, which ftune does not save."""

    @property
    def merge(self) -> str | None:
        return "merge"


PEFT_TYPE = "LORA"
"""The peft_type of a saved adapter this method continues (`model.path` at an adapter folder)."""


def from_adapter(config: dict) -> dict:
    """The `peft:` keys a saved LoRA adapter's adapter_config.json fixes (its shape and what it computes)."""
    target = config.get("target_modules")
    return {"r": config.get("r"), "alpha": config.get("lora_alpha"), "dropout": config.get("lora_dropout"),
            "target_modules": sorted(target) if isinstance(target, list | set | tuple) else target,
            "modules_to_save": sorted(config["modules_to_save"]) if config.get("modules_to_save") else None,
            "bias": config.get("bias"), "use_rslora": config.get("use_rslora"), "use_dora": config.get("use_dora")}


ADJUSTABLE = ("dropout",)
"""Keys of `from_adapter` a continuing recipe may change (training settings, not the adapter's function)."""

INIT_WEIGHTS = {"default": True, "gaussian": "gaussian", "pissa": "pissa", "olora": "olora", "loftq": "loftq"}
MOVES_BASE_WEIGHTS = ("pissa", "olora")  # these change the base: the saved adapter is converted back


def token_layers(model, token_ids: list[int], whole: list[str] | None = None) -> dict[str, list[int]] | None:
    """peft's trainable_token_indices: the rows of `token_ids` in the input embedding, and in the output head
    when it is not tied to it (tied heads follow the embedding in peft). A layer named in `whole`
    (peft.modules_to_save) trains entirely already, so it gets no row adapter (peft refuses both)."""
    if not token_ids:
        return None
    names = {id(m): n for n, m in model.named_modules()}
    layers = [model.get_input_embeddings()]
    head = model.get_output_embeddings()
    if head is not None and not getattr(model.config, "tie_word_embeddings", False):
        layers.append(head)
    found = {names[id(m)]: list(token_ids) for m in layers if id(m) in names}
    found = {n: ids for n, ids in found.items() if n.rsplit(".", 1)[-1] not in (whole or [])}
    return found or None


def inject(model, cfg: Config, task: str, trained_tokens: list[int] | None = None):
    """Wrap `model` in LoRA adapters; `trained_tokens` (model.add_tokens and the special tokens set) get their
    embedding and head rows trained and saved with the adapter (peft's trainable tokens, not whole matrices)."""
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
        init_lora_weights=INIT_WEIGHTS[cfg.init],
        trainable_token_indices=token_layers(model, trained_tokens or [], cfg.modules_to_save),
        task_type=task_type,
    )
    return get_peft_model(model, config)
