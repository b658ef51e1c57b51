"""Shared base for method configs (kept apart so method modules don't import each other)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from ftune.errors import Problem


class MethodConfig(BaseModel):
    """Base of every `peft:` section: strict keys, finite numbers, frozen, documented fields."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True, allow_inf_nan=False)

    @property
    def uses_peft_library(self) -> bool:
        """True when the method is a peft adapter (saved as an adapter, not a full model)."""
        return True

    @property
    def merge(self) -> str | None:
        """How `ftune merge` makes a plain model of the output: `copy` (it is one already), `merge` (fold the
        adapter into the base), or None (it can't: the method adds computation that has no weights to fold into)."""
        return None if self.uses_peft_library else "copy"

    def part_modes(self) -> dict[str, str] | None:
        """What trains in each part of a vision-language model (vision, projector, language: `frozen`, `lora` or
        `full`), as the method reads `peft.modules`; None for a method that doesn't split a model into parts."""
        return None

    # What the rest of ftune asks of a method (the parallelism rules, the estimator, the peft and save stages), so
    # it dispatches on the method's answer instead of comparing its name; a plugin method answers for itself.
    @property
    def trains_whole_model(self) -> bool:
        """Every weight trains (tensor parallelism can split it; the FSDP units hold gradients of their size)."""
        return False

    @property
    def adapts_linear_layers(self) -> bool:
        """Adapters go on the linear layers `target_modules` names, resolved on the model (LoRA: the preflight's
        target check, the estimator's counts, added tokens' rows, a VLM's per-part modes)."""
        return False

    @property
    def moves_base_weights(self) -> bool:
        """The initialisation moves part of the base into the adapter: the save stage converts the final adapter
        against the initial one (LoRA's pissa/olora)."""
        return False

    trains_new_token_rows: ClassVar[bool] = True
    """Added tokens' embedding rows can train with this method (prefix tuning and LLaMA-Adapter train none)."""
    trains_vision_models: ClassVar[bool] = False
    """Supported on a vision-language model (`model.task: image-text-to-text`)."""
    vllm_loads: ClassVar[bool] = False
    """vLLM (`train.rl.generation.backend: vllm`) can load what this method trains."""
    paged_generates: ClassVar[bool] = False
    """Continuous batching (`train.rl.generation.backend: paged`) samples from what this method trains: its own
    paged KV cache carries no prefix key/values or adaption prompts, only the model's own layers."""
    inject_errors_at: ClassVar[str] = "peft"
    """The recipe key an `inject` error is located at (freeze: `peft.trainable`)."""
    experts_hint: ClassVar[str] = "use peft.method lora or full"
    """How to make the experts of an MoE train with this method (the estimator's note when none does)."""

    def problems(self, recipe) -> list[Problem]:
        """The method's own recipe rules (run with the rules when a recipe loads)."""
        return []

    def trained_names(self, model) -> list[str]:
        """What the method trains on an injected (meta) model, as `ftune plan` lists it."""
        return ["all parameters"]


class _PartModes(BaseModel):
    """`peft.modules`' shape: one field per part of a vision-language model (vision, projector, language)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    def of(self, part: str) -> str:
        return getattr(self, part)

    def modes(self) -> dict[str, str]:
        """Each part's mode, in the parts' order (the fields)."""
        return {part: self.of(part) for part in type(self).model_fields}


class VisionModules(_PartModes):
    """`peft.modules`: what trains in each part of a vision-language model (`model.task: image-text-to-text`); the
    part of a module is decided by `ftune.models.vision_parts.part_of`."""

    vision: Literal["frozen", "lora", "full"] = "frozen"
    """The vision tower (image encoder): kept `frozen` (the default), adapted with `lora`, or trained in `full`."""
    projector: Literal["frozen", "lora", "full"] = "full"
    """The projector from image features to the language model's embeddings: trained in `full` by default (it is
    small), with `lora`, or `frozen`."""
    language: Literal["lora", "full", "frozen"] = "lora"
    """The language model (embeddings, decoder layers, head): `lora` on the linear layers `target_modules` names,
    `full`, or `frozen`."""


class FullVisionModules(_PartModes):
    """`peft.modules` under `peft.method: full`: which parts of a vision-language model train in full and which stay
    `frozen` (bit-identical to the base); a part not written trains in full."""

    vision: Literal["frozen", "full"] = "full"
    """The vision tower (image encoder): trained in `full` (the default), or kept `frozen`."""
    projector: Literal["frozen", "full"] = "full"
    """The projector from image features to the language model's embeddings: `full` (the default) or `frozen`."""
    language: Literal["frozen", "full"] = "full"
    """The language model (embeddings, decoder layers, head): `full` (the default) or `frozen`."""
