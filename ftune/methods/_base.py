"""Shared base for method configs (kept apart so method modules don't import each other)."""

from __future__ import annotations

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
