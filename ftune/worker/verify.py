"""Reading saved tensors back: final/ and every checkpoint are compared with the model that wrote them (names,
shapes, finiteness) before they are marked complete. A mismatch, or a folder with zero tensors, is an error, never a
silent success.
"""

from __future__ import annotations

from pathlib import Path

from ftune.errors import RunError
from ftune.runtime.saved import saved_tensors
from ftune.worker.finite import nonfinite_saved
from ftune.worker.names import (
    PROMPT_EMBEDDINGS,
    adapter_saved_name,
    as_model_names,
    as_saved,
    clean,
    without_adapter_name,
)
from ftune.worker.stop import ADVICE


def expected_tensors(model, is_adapter: bool) -> dict[str, tuple[int, ...]]:
    """Names and shapes a correct save of `model` must contain."""
    if is_adapter:
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(model)
        return {k: tuple(v.shape) for k, v in state.items()}
    return as_saved(model, {k: tuple(v.shape) for k, v in model.state_dict().items()})


def expected_from_full_state(model, state: dict, is_adapter: bool) -> dict[str, tuple[int, ...]]:
    """Expected names/shapes for a sharded model, from its gathered full state dict.

    For an adapter the names are the model's own trainable parameters (not peft's filtering, which
    is what goes wrong under FSDP v1), so an empty or partial adapter fails the check.
    """
    if not is_adapter:
        return as_saved(model, {k: tuple(v.shape) for k, v in state.items()})
    from peft import get_peft_model_state_dict

    trainable = {clean(n) for n, p in model.named_parameters() if p.requires_grad}
    name = getattr(model, "active_adapter", "default")
    chosen = get_peft_model_state_dict(model, state_dict=as_model_names(model, state), adapter_name=name)
    chosen = {without_adapter_name(clean(k), name): v for k, v in chosen.items()}
    if len(chosen) >= len(trainable):
        return {k: tuple(v.shape) for k, v in chosen.items()}
    # peft picked fewer tensors than the model trains: expect them all, so the check fails loudly
    return {n: tuple(state[n].shape) if n in state else (-1,) for n in trainable}


def _mismatch(found: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]], *, extra: bool,
              comparable=lambda name: True) -> str:
    """What differs between the tensors found in a folder and those expected ("" when nothing): missing names,
    wrong shapes (where `comparable`), and with `extra` names nobody expected."""
    missing = sorted(set(expected) - set(found))
    wrong = sorted(k for k in set(expected) & set(found) if comparable(k) and expected[k] != found[k])
    unexpected = sorted(set(found) - set(expected)) if extra else []
    return "; ".join(part for part in (
        f"missing {missing[:5]}" if missing else "",
        f"wrong shapes {[(k, found[k], expected[k]) for k in wrong[:3]]}" if wrong else "",
        f"unexpected {unexpected[:5]}" if unexpected else "",
    ) if part)


def verify(folder: Path, expected: dict[str, tuple[int, ...]], *, is_adapter: bool) -> None:
    """final/ read back: every expected tensor with its shape (and, for a full model, nothing else), all finite."""
    found = saved_tensors(folder)
    if not found:
        raise RunError(
            f"save check failed: {folder} holds no tensors",
            hint="the saved adapter/model is empty; report this with the run dir",
        )
    if is_adapter:
        # peft strips the adapter name ("default") when saving.
        expected = {k.replace(".default", ""): v for k, v in expected.items()}
    # a full model: tied weights may be saved once; anything else unexpected is a mismatch
    detail = _mismatch(found, expected, extra=not is_adapter)
    if detail:
        raise RunError(f"save check failed for {folder}: {detail}",
                       hint="the written files do not match the trained model; the run dir keeps the checkpoints")
    bad = nonfinite_saved(folder)
    if bad:
        raise RunError(f"save check failed for {folder}: {len(bad)} tensor(s) hold NaN or infinity, e.g. {bad[:3]}",
                       hint="final/ is not marked complete; " + ADVICE)


def checkpoint_tensors(folder: Path) -> dict[str, tuple[int, ...]]:
    """Names and (global) shapes of the model tensors in a Trainer checkpoint, sharded or not.

    FSDP sharded checkpoints are DCP folders (`pytorch_model_fsdp_0/`) whose metadata lists every
    tensor with its full shape under a `model.` prefix; other checkpoints hold safetensors files.
    """
    dcp_dirs = sorted(d for d in folder.glob("pytorch_model_fsdp_*") if d.is_dir())
    full = sorted(folder.glob("pytorch_model_fsdp*.bin"))  # FSDP full state dict checkpoints
    if full:
        import torch

        state: dict = {}
        for f in full:
            state.update(torch.load(str(f), map_location="cpu", weights_only=True, mmap=True))
        return {clean(k.removeprefix("model.")): tuple(v.shape) for k, v in state.items() if hasattr(v, "shape")}
    if not dcp_dirs:
        return saved_tensors(folder)
    from torch.distributed.checkpoint import FileSystemReader

    shapes: dict[str, tuple[int, ...]] = {}
    for d in dcp_dirs:
        meta = FileSystemReader(str(d)).read_metadata()
        for name, item in meta.state_dict_metadata.items():
            if hasattr(item, "size"):
                shapes[clean(name.removeprefix("model."))] = tuple(item.size)
    return shapes


def verify_checkpoint(folder: Path, model, is_adapter: bool) -> None:
    """Read a just-written checkpoint back and compare names (and shapes, where they are global).

    Called on rank 0 before the checkpoint is marked complete: a checkpoint that would restore
    nothing (or part of the model) is an error, not a resumable checkpoint.
    """
    found = checkpoint_tensors(folder)
    if is_adapter:  # full adapter checkpoints keep the adapter name; sharded ones and final/ drop it
        found = {k.replace(".default", ""): v for k, v in found.items()}
        wanted = {adapter_saved_name(n): p for n, p in model.named_parameters() if p.requires_grad}
    else:
        wanted = {clean(n): p for n, p in model.named_parameters()}
    if not found:
        raise RunError(f"checkpoint check failed: {folder} holds no model tensors",
                       hint="the checkpoint would restore nothing; report this with the run dir")
    # FSDP v1 flattens the local shard (1-D views), so only DTensor / plain shapes are comparable
    detail = _mismatch(found, {n: tuple(p.shape) for n, p in wanted.items()}, extra=False,
                       comparable=lambda n: n != PROMPT_EMBEDDINGS and wanted[n].dim() > 1)
    if detail:
        raise RunError(f"checkpoint check failed for {folder}: {detail}",
                       hint="the checkpoint does not match the model being trained; it is not marked complete")
