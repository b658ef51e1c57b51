"""LoRA: low-rank adapters on chosen linear layers (peft.LoraConfig)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from ftune.errors import Problem
from ftune.methods._base import MethodConfig, VisionModules


class Config(MethodConfig):
    method: Literal["lora"] = "lora"
    """Low-rank adaptation (LoRA)."""
    r: int = 8
    """LoRA rank: the inner dimension of the A·B update. Must be > 0; 8-64 is typical."""
    alpha: float = 16
    """LoRA scaling numerator; the update is scaled by alpha / r (alpha / sqrt(r) with use_rslora)."""
    dropout: float = Field(0.05, ge=0.0, lt=1.0)
    """Dropout on the LoRA input, in [0, 1). LoRA on parameters (MoE experts, `target_parameters`) can't apply it:
    there it defaults to 0 (said in the plan), and a value > 0 written in the recipe is refused."""
    target_modules: list[str] | Literal["all-linear"] = Field(default_factory=lambda: ["q_proj", "v_proj"])
    """Module names (or name suffixes) to adapt, or `all-linear` for every linear layer but the head (on a
    mixture-of-experts model: attention, the experts and the shared experts; the router as `router` says)."""
    target_parameters: list[str] | None = None
    """Parameters adapted directly (peft's name), by name or name suffix: the fused expert tensors of an MoE model
    (`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`: shape [experts, ...]), which are no linear layers.
    Checked against the model's real parameter names before launch."""
    experts: bool = False
    """Mixture-of-experts models: adapt every expert tensor (each expert gets its own rank-r update) and the shared
    experts' linear layers. Refused on a dense model."""
    router: Literal["frozen", "lora", "full"] = "frozen"
    """Mixture-of-experts models: the router (`mlp.gate`) stays `frozen`, gets a LoRA update (`lora`), or trains in
    full and is saved with the adapter (`full`)."""
    modules_to_save: list[str] | None = None
    """Extra modules trained in full and saved with the adapter (e.g. `score` for classification)."""
    modules: VisionModules | None = None
    """Vision-language models (`model.task: image-text-to-text`): what trains in each part, `{vision, projector,
    language}` each `frozen`, `lora` or `full`; default `{vision: frozen, projector: full, language: lora}`.
    LoRA goes on the linear layers of a `lora` part that `target_modules` names (`all-linear`: all of them); a
    `full` part trains whole and is saved with the adapter (docs/vision.md)."""
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

    def part_modes(self) -> dict[str, str]:
        return (self.modules or VisionModules()).modes()

    @property
    def adapts_linear_layers(self) -> bool:
        return True

    trains_vision_models: ClassVar[bool] = True
    vllm_loads: ClassVar[bool] = True
    paged_generates: ClassVar[bool] = True
    experts_hint: ClassVar[str] = "set `peft.experts: true` (or target_modules: all-linear)"

    def problems(self, recipe) -> list[Problem]:
        """The rank, and an init that rewrites the base (pissa, olora, loftq) against what else the recipe asks."""
        found = []
        if self.r <= 0:
            found.append(Problem.at("peft.r", f"LoRA rank must be > 0, got {self.r}", "use a rank such as 8, 16 or 64"))
        if self.init in ("default", "gaussian"):
            return found
        if self.init == "loftq":
            return found + [Problem.at(
                "peft.init", "peft.init 'loftq' replaces the base weights with their LoftQ quantization, and the "
                "adapter only fits that new base, which ftune does not save (and peft runs LoftQ only on a CUDA "
                "device with bitsandbytes)", "use `peft.init: pissa` (or `olora`), or QLoRA (`quantization: {bits: "
                "4}`) with the default init")]
        if recipe.kbit is not None:
            found.append(Problem.at("peft.init", f"peft.init '{self.init}' rewrites the base weights, which a "
                                    f"{recipe.kbit.bits}-bit base can't take",
                                    "remove `quantization`, or use `peft.init: default`"))
        if recipe.distributed.strategy in ("fsdp", "deepspeed"):
            found.append(Problem.at("peft.init", f"peft.init '{self.init}' saves an adapter converted against the "
                                    f"initial one, which ftune does not gather under {recipe.distributed.strategy}",
                                    "use `distributed.strategy: ddp` (or none), or `peft.init: default`"))
        if self.use_dora:
            found.append(Problem.at("peft.init", f"peft.init '{self.init}' can't be combined with use_dora",
                                    "use one of them"))
        return found

    def trained_names(self, model) -> list[str]:
        names = getattr(model.base_model, "targeted_module_names", None) or [
            n for n, m in model.named_modules() if hasattr(m, "lora_A")]
        names = list(dict.fromkeys([*names, *getattr(model.base_model, "targeted_parameter_names", [])]))
        return [n.removeprefix("base_model.model.") for n in names]

    @property
    def moves_base_weights(self) -> bool:
        return self.init in MOVES_BASE_WEIGHTS


PEFT_TYPE = "LORA"
"""The peft_type of a saved adapter this method continues (`model.path` at an adapter folder)."""


def from_adapter(config: dict) -> dict:
    """The `peft:` keys a saved LoRA adapter's adapter_config.json fixes (its shape and what it computes)."""
    target = config.get("target_modules")
    return {"r": config.get("r"), "alpha": config.get("lora_alpha"), "dropout": config.get("lora_dropout"),
            "target_modules": sorted(target) if isinstance(target, list | set | tuple) else target,
            "modules_to_save": sorted(config["modules_to_save"]) if config.get("modules_to_save") else None,
            "bias": config.get("bias"), "use_rslora": config.get("use_rslora"), "use_dora": config.get("use_dora"),
            **_parameters_from_adapter(config)}


def _parameters_from_adapter(config: dict) -> dict:
    """A saved adapter's target_parameters (MoE experts, router): recorded as ftune wrote them."""
    params = config.get("target_parameters")
    return {"target_parameters": sorted(params)} if params else {}


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


def target_problems(model, cfg: Config) -> list:
    """Problems with the recipe's LoRA targets on `model` (the meta model, before launch), located by key."""
    from ftune.methods._lora_targets import resolve

    return resolve(model, cfg)[1]


def resolve_targets(model, cfg: Config):
    """The targets peft is given (ftune.methods._lora_targets), or a RecipeError of the problems at their keys."""
    from ftune.errors import RecipeError
    from ftune.methods._lora_targets import resolve

    targets, problems = resolve(model, cfg)
    if errors := [p for p in problems if p.severity == "error"]:
        raise RecipeError(errors)
    return targets


def inject(model, cfg: Config, task: str, trained_tokens: list[int] | None = None):
    """Wrap `model` in LoRA adapters; `trained_tokens` (model.add_tokens and the special tokens set) get their
    embedding and head rows trained and saved with the adapter (peft's trainable tokens, not whole matrices)."""
    from peft import LoraConfig, get_peft_model

    task_type = "SEQ_CLS" if task == "sequence-classification" else "CAUSAL_LM"
    targets = resolve_targets(model, cfg)
    config = LoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=targets.dropout,
        target_modules=targets.modules,
        target_parameters=targets.parameters or None,
        modules_to_save=targets.modules_to_save,
        bias=cfg.bias,
        use_rslora=cfg.use_rslora,
        use_dora=cfg.use_dora,
        init_lora_weights=INIT_WEIGHTS[cfg.init],
        trainable_token_indices=token_layers(model, trained_tokens or [], targets.modules_to_save),
        task_type=task_type,
    )
    return get_peft_model(model, config)
