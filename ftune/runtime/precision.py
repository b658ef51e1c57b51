"""FSDP2's mixed precision, as the Plan compiled it, handed to the trainer's accelerator: the run's trainer and
`ftune eval`'s are built the same way (`ftune.runtime.train`, `ftune.runtime.rl`); and the float32 weights TRL's paged
generation casts, held and put back (`hold_weights`, `put_back`)."""

from __future__ import annotations


def set_mixed_precision_policy(accelerator, plan) -> None:
    """Give accelerate's FSDP plugin the Plan's MixedPrecisionPolicy (`plan.fsdp_mixed_precision`). Called as soon
    as the Trainer has its accelerator, before TRL wraps a reference model or `train()` wraps the policy."""
    spec = plan.fsdp_mixed_precision
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    if spec is None or plugin is None:
        return
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    plugin.mixed_precision_policy = MixedPrecisionPolicy(
        **{key: None if name is None else getattr(torch, name) for key, name in spec.items()})


def hold_weights(model, args):
    """TRL's continuous-batching path casts the whole model to bf16 (fp16) under bf16 (fp16) mixed precision before
    it generates, and leaves it so (trl 1.16): float32 weights, a LoRA adapter's included, would then train in bf16,
    their low bits lost at every step. The weights and buffers that cast would change are held here (the tensors
    themselves, no copy) and put back after generation (`put_back`), so training sees the same master weights as
    with `backend: transformers`; generation still runs in bf16, as TRL intends."""
    import torch

    target = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else None
    if target is None:
        return None
    params = [(p, p.data) for p in model.parameters() if p.is_floating_point() and p.dtype != target]
    buffers = [(m, n, b) for m in model.modules() for n, b in m._buffers.items()
               if b is not None and b.is_floating_point() and b.dtype != target]
    return params, buffers


def put_back(held) -> None:
    if held is None:
        return
    params, buffers = held
    for p, data in params:
        p.data = data
    for module, name, tensor in buffers:
        module._buffers[name] = tensor
