"""FSDP2's mixed precision, as the Plan compiled it, handed to the trainer's accelerator: the run's trainer and
`ftune eval`'s are built the same way (`ftune.runtime.train`, `ftune.runtime.rl`)."""

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
