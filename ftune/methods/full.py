"""Full fine-tuning: every parameter trains; the output is a whole model. On a vision-language model,
`peft.modules` keeps parts `frozen` (bit-identical to the base) and trains the others in `full`."""

from __future__ import annotations

from typing import ClassVar, Literal

from ftune.methods._base import FullVisionModules, MethodConfig


class Config(MethodConfig):
    method: Literal["full"] = "full"
    """Full fine-tuning: all parameters are trained."""
    modules: FullVisionModules | None = None
    """Vision-language models (`model.task: image-text-to-text`): which parts train, `{vision, projector,
    language}` each `full` (the default) or `frozen`; `{vision: frozen}` keeps the image encoder as the base has it
    and trains the projector and the language model (docs/vision.md)."""

    trains_vision_models: ClassVar[bool] = True
    vllm_loads: ClassVar[bool] = True
    paged_generates: ClassVar[bool] = True

    @property
    def uses_peft_library(self) -> bool:
        return False

    def part_modes(self) -> dict[str, str]:
        return (self.modules or FullVisionModules()).modes()

    @property
    def trains_whole_model(self) -> bool:
        return True


def inject(model, cfg: Config, task: str):
    """Every parameter trains, but those of a vision-language model's `frozen` parts (ftune.models.vision_parts.part_of)."""
    from ftune.models.vision_parts import is_vision_language, part_of

    kind = getattr(model.config, "model_type", None)
    modes = cfg.part_modes() if is_vision_language(kind) else None
    for name, p in model.named_parameters():
        p.requires_grad_(modes is None or modes[part_of(name, kind)] != "frozen")
    return model
