"""Quantization-aware training with torchao, carried out as the Plan says (`recipe.qat`): the linear layers swapped
for fake-quantized ones before training (`prepare`), turned on after `start_after_steps` (`StartFakeQuant`), swapped
back to plain linears before final/ is saved (`unwrap`: final/ holds the trained full-precision weights), and the
truly quantized model written by `ftune merge` (`quantization_config`: the same scheme, applied by transformers'
TorchAoConfig, so the folder reloads with plain `from_pretrained`). What this machine can run is decided before
launch (`ftune.plan.qat`); this module never refuses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ftune.quiet import quiet_torchao

if TYPE_CHECKING:
    from ftune.recipe.schema import QatSection


def ptq_config(qat: QatSection):
    """The torchao post-training config of the scheme: QAT's prepare step infers its fake quantizers from it, and
    the convert step applies it (int4 weights stored unpacked in int8: the layout torchao runs on CPU too)."""
    import torch
    from torchao.quantization import (
        Float8DynamicActivationFloat8WeightConfig,
        Int8DynamicActivationIntxWeightConfig,
        IntxWeightOnlyConfig,
        PerGroup,
        PerRow,
    )

    if qat.scheme == "int4-weight":
        return IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(qat.group_size))
    if qat.scheme == "int8-dynamic-act-int4-weight":
        return Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(qat.group_size))
    return Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())


def prepare(model, qat: QatSection):
    """Swap every quantized linear layer (`ftune.plan.qat.quantized_linears`: all but the output head) for
    torchao's fake-quantized linear, in place; fake quantization starts off when `start_after_steps` > 0."""
    quiet_torchao()
    from torchao.quantization import quantize_
    from torchao.quantization.qat import QATConfig

    from ftune.plan.qat import quantized_linears

    names = set(quantized_linears(model))
    quantize_(model, QATConfig(ptq_config(qat), step="prepare"), filter_fn=lambda _m, fqn: fqn in names)
    if qat.start_after_steps:
        set_fake_quant(model, False)
    return model


def fake_quantized(model) -> list:
    from torchao.quantization.qat.linear import FakeQuantizedLinear

    return [m for m in model.modules() if isinstance(m, FakeQuantizedLinear)]


def set_fake_quant(model, enabled: bool) -> None:
    from torchao.quantization.qat.linear import enable_linear_fake_quant

    for module in fake_quantized(model):
        enable_linear_fake_quant(module, enabled=enabled)


def unwrap(model):
    """The fake-quantized linears swapped back for plain ones with the same trained weights (QAT's convert step
    without a config): final/ then holds the names and tensors of the base model."""
    from torchao.quantization import quantize_
    from torchao.quantization.qat import QATConfig

    quantize_(model, QATConfig(step="convert"), filter_fn=None)
    return model


def start_callback(qat: QatSection):
    """A Trainer callback turning fake quantization on at the start of step `start_after_steps` (a resumed run
    past it turns it on at its first step)."""
    from transformers import TrainerCallback

    class StartFakeQuant(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kwargs):
            if state.global_step >= qat.start_after_steps and model is not None and not self.started:
                set_fake_quant(model, True)
                self.started = True

        started = False

    return StartFakeQuant()


def quantization_config(model, qat: QatSection):
    """transformers' TorchAoConfig of the scheme, skipping exactly the layers QAT left in full precision."""
    quiet_torchao()
    from transformers import TorchAoConfig

    from ftune.plan.qat import quantized_linears

    import torch

    quantized = set(quantized_linears(model))
    skip = sorted(n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n not in quantized)
    return TorchAoConfig(quant_type=ptq_config(qat), modules_to_not_convert=skip)
