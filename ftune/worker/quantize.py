"""A quantized base made trainable: k-bit preparation (the run's alone).

The base model is loaded 4-bit (nf4/fp4) or 8-bit (the config is compiled into `plan.model_load`) and frozen;
LoRA trains on top. The CPU repacking guard and the eval-time reload live in `ftune.runtime.quantized`.
"""

from __future__ import annotations

from ftune.runtime.quantized import guard


def prepare(model, *, upcast: bool, checkpointing: bool):
    """Freeze the quantized base and make it trainable under adapters; returns the model.

    The worker passes the Plan's decisions: `upcast` is `plan.upcast_non_quantized` (peft's default, not under
    FSDP), and then this is peft's `prepare_model_for_kbit_training` (norms and the head upcast to fp32, input
    grads), otherwise the same without the upcast; `checkpointing` is `plan.activation_checkpointing ==
    "trainer"`: under FSDP activation checkpointing FSDP owns it, and turning the model's on here as well would
    checkpoint every layer twice.
    """
    gc = checkpointing
    gc_kwargs = {"use_reentrant": False}
    if not upcast:
        for p in model.parameters():
            p.requires_grad_(False)
        if gc:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gc_kwargs)  # non-reentrant: no input grads
    else:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=gc, gradient_checkpointing_kwargs=gc_kwargs
        )
    if gc and getattr(model, "config", None) is not None:
        model.config.use_cache = False
    guard(model)
    return model
