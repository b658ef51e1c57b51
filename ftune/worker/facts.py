"""Test instrumentation: what the distributed run really is (world size, wrapping, sharding, data split).

Runs only when the environment asks for it (`FTUNE_RECORD_FACTS=1`, set by the distributed tests): it builds
an extra dataloader and writes `distributed.rank<N>.json`, work a user's run never needs.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

ENV_FLAG = "FTUNE_RECORD_FACTS"


def enabled() -> bool:
    return os.environ.get(ENV_FLAG) == "1"


def record(trainer, run, rank: int) -> None:
    """Write this rank's facts now (before wrapping), and again once the Trainer has wrapped the model."""
    from transformers import TrainerCallback

    def write() -> None:
        facts = _facts(trainer.model, trainer)
        facts["rank"] = rank
        run.rank_facts(rank).write_text(json.dumps(facts, default=str) + "\n")

    class DistributedFacts(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            write()

    write()
    trainer.add_callback(DistributedFacts())


def _is_dtensor(t) -> bool:
    return type(t).__name__ == "DTensor"


def _first_batch_fingerprint(trainer) -> dict[str, Any]:
    """What this rank's first training batch holds: tests compare ranks to prove they see different data."""
    try:
        batch = next(iter(trainer.get_train_dataloader()))
    except (StopIteration, TypeError, ValueError):
        return {}
    ids = batch["input_ids"].detach().cpu()
    return {"first_batch_shape": list(ids.shape), "first_batch_sum": int(ids.sum()),
            "first_batch_sha1": hashlib.sha1(ids.numpy().tobytes()).hexdigest(),
            "first_batch_ids": ids.tolist() if ids.numel() <= 4096 else None}  # small batches: which rows they are


def _facts(model, trainer) -> dict:
    import torch.distributed as dist

    wrapped = getattr(trainer, "model_wrapped", None) or model
    acc = getattr(trainer, "accelerator", None)
    fsdp_units = [m for m in wrapped.modules()
                  if type(m).__name__ == "FullyShardedDataParallel" or type(m).__name__.startswith("FSDP")]
    params = list(wrapped.parameters())
    facts: dict[str, Any] = {
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "rank": dist.get_rank() if dist.is_initialized() else 0,
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "distributed_type": str(acc.distributed_type).rsplit(".", 1)[-1] if acc is not None else None,
        "fsdp_version": getattr(getattr(acc.state, "fsdp_plugin", None), "fsdp_version", None) if acc else None,
        "wrapper": type(wrapped).__name__,
        "ddp": type(wrapped).__name__ == "DistributedDataParallel",
        "find_unused_parameters": getattr(wrapped, "find_unused_parameters", None),
        "fsdp_units": len(fsdp_units),
        "fsdp_unit_classes": sorted({type(m).__name__ for m in fsdp_units}),
        "dtensor_params": sum(_is_dtensor(p) for p in params),
        "params": len(params),
        "local_numel": sum(p.to_local().numel() if _is_dtensor(p) else p.numel() for p in params),
        "full_numel": sum(p.numel() for p in params),
        # who checkpoints activations: HF's per-layer flag (the Trainer, or k-bit preparation) and FSDP's wrappers
        "hf_checkpointing_layers": sum(getattr(m, "gradient_checkpointing", False) is True for m in wrapped.modules()),
        "fsdp_checkpoint_wrappers": sum(type(m).__name__.endswith("CheckpointWrapper") for m in wrapped.modules()),
    }
    facts.update(_first_batch_fingerprint(trainer))
    return facts
