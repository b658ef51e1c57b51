"""The recipe schema: one typed model per section, the single source of truth.

Each field's documentation sits under it; it becomes the JSON Schema description (`make schemas`)
and the text `ftune show` and the docs use. The validated `Recipe` is what the rest of ftune
reads: it is never dumped back to an untyped dict before use.

One module per section (model, data, quantization, distributed, train, eval, output: checkpoint and output);
`Recipe` assembles them here, and every name callers import is re-exported from `ftune.recipe.schema`.
"""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import Field

from ftune.methods import config_classes
from ftune.recipe.schema.base import Section
from ftune.recipe.schema.data import (BUILTIN_FORMATS, FORMAT_ALIASES, FORMATS, DataSection, DataSource, EvalSplit,
                                      Fields, ImageSettings)
from ftune.recipe.schema.distributed import (MAX_NODES, MAX_PROCESSES_PER_NODE, DeepSpeedSection,
                                             DistributedSection, FsdpSection, ParallelismSection)
from ftune.recipe.schema.eval import BenchmarksEval, EvalSection, GenerateEval
from ftune.recipe.schema.model import InitFrom, ModelSection, SpecialTokens
from ftune.recipe.schema.output import (CheckpointSection, MlflowSettings, OutputSection, Trackers,
                                        WandbSettings)
from ftune.recipe.schema.quantization import QatSection, QuantizationSection
from ftune.recipe.schema.train import (BUILTIN_OBJECTIVES, LR_SCHEDULERS, OBJECTIVES, CallbackSpec,
                                       DataloaderSection, DistillSection, EarlyStopping, GenerationSection,
                                       PreferenceSection, RewardSpec, RLSection, RouterCollapse, ToolSpec,
                                       TrainSection)

__all__ = [
    "BUILTIN_FORMATS", "BUILTIN_OBJECTIVES", "FORMATS", "FORMAT_ALIASES", "LR_SCHEDULERS", "MAX_NODES",
    "MAX_PROCESSES_PER_NODE", "OBJECTIVES", "SCHEMA_VERSION", "BenchmarksEval", "CallbackSpec", "CheckpointSection",
    "DataSection", "DataSource", "DataloaderSection", "DeepSpeedSection", "DistillSection", "DistributedSection",
    "EarlyStopping", "EvalSection", "EvalSplit", "Fields", "FsdpSection", "GenerateEval", "GenerationSection",
    "ImageSettings", "InitFrom", "MlflowSettings", "ModelSection", "OutputSection", "ParallelismSection",
    "PeftSection", "PreferenceSection", "QatSection", "QuantizationSection", "RLSection", "Recipe", "RewardSpec",
    "RouterCollapse", "Section", "SpecialTokens", "ToolSpec", "Trackers", "TrainSection", "WandbSettings",
]

SCHEMA_VERSION = 1

PeftSection = Annotated[Union[tuple(config_classes())], Field(discriminator="method")]  # noqa: UP007


class Recipe(Section):
    """A fine-tuning recipe."""

    schema_version: int = SCHEMA_VERSION
    """Recipe format version; this ftune reads version 1."""
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """Run name; letters, digits, '.', '_' and '-'."""
    description: str | None = None
    """Free text."""
    extends: str | list[str] | None = None
    """Base recipe(s) to start from, relative to this file; deep-merged in order, lists replaced."""
    model: ModelSection
    """What is fine-tuned."""
    data: DataSection
    """What it is trained on."""
    peft: PeftSection = Field(default_factory=lambda: config_classes()[0]())  # type: ignore[valid-type]
    """Fine-tuning method: lora | prefix | llama-adapter | full | freeze."""
    quantization: QuantizationSection | None = None
    """Load the base quantized with bitsandbytes (QLoRA: `bits`), or train quantization-aware (`qat`, torchao)."""
    distributed: DistributedSection = Field(default_factory=DistributedSection)
    """Processes, machines and sharding."""
    train: TrainSection = Field(default_factory=TrainSection)
    """Optimisation."""
    eval: EvalSection = Field(default_factory=EvalSection)
    """Evaluation during training."""
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    """Checkpoints and resume."""
    output: OutputSection = Field(default_factory=OutputSection)
    """Where results go."""

    @property
    def kbit(self) -> QuantizationSection | None:
        """The bitsandbytes-quantized base (`quantization.bits`); None without one, a QAT-only section too."""
        q = self.quantization
        return q if q is not None and q.bits is not None else None

    @property
    def qat(self) -> QatSection | None:
        """Quantization-aware training (`quantization.qat`), or None."""
        return self.quantization.qat if self.quantization is not None else None
