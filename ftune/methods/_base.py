"""Shared base for method configs (kept apart so method modules don't import each other)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


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


class VisionModules(BaseModel):
    """`peft.modules`: what trains in each part of a vision-language model (`model.task: image-text-to-text`); the
    part of a module is decided by `ftune.models.vision.part_of`."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    vision: Literal["frozen", "lora", "full"] = "frozen"
    """The vision tower (image encoder): kept `frozen` (the default), adapted with `lora`, or trained in `full`."""
    projector: Literal["frozen", "lora", "full"] = "full"
    """The projector from image features to the language model's embeddings: trained in `full` by default (it is
    small), with `lora`, or `frozen`."""
    language: Literal["lora", "full", "frozen"] = "lora"
    """The language model (embeddings, decoder layers, head): `lora` on the linear layers `target_modules` names,
    `full`, or `frozen`."""

    def of(self, part: str) -> str:
        return getattr(self, part)


class FullVisionModules(BaseModel):
    """`peft.modules` under `peft.method: full`: which parts of a vision-language model train in full and which stay
    `frozen` (bit-identical to the base); a part not written trains in full."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    vision: Literal["frozen", "full"] = "full"
    """The vision tower (image encoder): trained in `full` (the default), or kept `frozen`."""
    projector: Literal["frozen", "full"] = "full"
    """The projector from image features to the language model's embeddings: `full` (the default) or `frozen`."""
    language: Literal["frozen", "full"] = "full"
    """The language model (embeddings, decoder layers, head): `full` (the default) or `frozen`."""

    def of(self, part: str) -> str:
        return getattr(self, part)
