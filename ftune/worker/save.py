"""Save `final/` — a normal HF model or PEFT adapter folder plus the tokenizer — and verify it.

After writing, the saved tensors are read back and their names and shapes compared with the model's;
a mismatch (or an adapter with zero tensors) is an error, never a silent success. Only then is the
completion marker written.
"""

from __future__ import annotations

import json
from pathlib import Path

from ftune.adapter import RECORD
from ftune.errors import RunError
from ftune.rundir import mark_complete
from ftune.worker.stop import ADVICE, nonfinite


def saved_tensors(folder: Path) -> dict[str, tuple[int, ...]]:
    """Names and shapes of every tensor in the folder's safetensors files (no data read)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def expected_tensors(model, is_adapter: bool) -> dict[str, tuple[int, ...]]:
    """Names and shapes a correct save of `model` must contain."""
    if is_adapter:
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(model)
    else:
        state = model.state_dict()
    return {k: tuple(v.shape) for k, v in state.items()}


QUANTIZED_LAYERS = ("Linear4bit", "Linear8bitLt")
"""bitsandbytes layers: their `weight` holds packed integers stored in a float dtype (uint8 bytes reinterpreted as
bf16/fp32 under FSDP's `quant_storage`, which can read as NaN), never a float to check."""


def packed_weights(model) -> set[str]:
    """Clean names (no FSDP / checkpoint-wrapper segments) of bitsandbytes' packed weights in `model`: the
    finiteness checks skip them. bitsandbytes' classes only (peft's LoRA wrappers share the names), subclasses
    (FSDP2's `FSDPLinear4bit`) too."""
    return {_clean(f"{name}.weight") for name, m in model.named_modules()
            if any(c.__name__ in QUANTIZED_LAYERS and c.__module__.startswith("bitsandbytes.")
                   for c in type(m).__mro__)}


def first_nonfinite_of(tensors, packed: set[str]) -> str | None:
    """Clean name of the first (name, tensor) pair holding a NaN or an infinity, packed weights skipped, or None.
    The one finiteness rule for a model's parameters and a gathered state dict alike."""
    import torch

    with torch.no_grad():
        for name, t in tensors:
            name = _clean(name)
            if name in packed or not (t.numel() and t.is_floating_point()):
                continue
            if not bool(torch.isfinite(t).all()):
                return name
    return None


def first_nonfinite(model, *, trainable_only: bool) -> str | None:
    """Name of the first parameter holding a NaN or an infinity (this process's shard), or None."""
    return first_nonfinite_of(((n, p) for n, p in model.named_parameters() if p.requires_grad or not trainable_only),
                              packed_weights(model))


def nonfinite_saved(folder: Path) -> list[str]:
    """Names of saved tensors holding a NaN or an infinity (reads every tensor back)."""
    import torch
    from safetensors import safe_open

    bad = []
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                    bad.append(name)
    return bad


def verify(folder: Path, expected: dict[str, tuple[int, ...]], *, is_adapter: bool) -> None:
    found = saved_tensors(folder)
    if not found:
        raise RunError(
            f"save check failed: {folder} holds no tensors",
            hint="the saved adapter/model is empty; report this with the run dir",
        )
    if is_adapter:
        # peft strips the adapter name ("default") when saving.
        expected = {k.replace(".default", ""): v for k, v in expected.items()}
    missing = sorted(set(expected) - set(found))
    wrong = sorted(k for k in set(expected) & set(found) if expected[k] != found[k])
    if is_adapter:
        extra = []
    else:  # tied weights may be saved once; anything else unexpected is a mismatch
        extra = sorted(set(found) - set(expected))
    if missing or wrong or extra:
        detail = "; ".join(
            part for part in (
                f"missing {missing[:5]}" if missing else "",
                f"wrong shapes {[(k, found[k], expected[k]) for k in wrong[:3]]}" if wrong else "",
                f"unexpected {extra[:5]}" if extra else "",
            ) if part
        )
        raise RunError(f"save check failed for {folder}: {detail}",
                       hint="the written files do not match the trained model; the run dir keeps the checkpoints")
    bad = nonfinite_saved(folder)
    if bad:
        raise RunError(f"save check failed for {folder}: {len(bad)} tensor(s) hold NaN or infinity, e.g. {bad[:3]}",
                       hint="final/ is not marked complete; " + ADVICE)


FSDP_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def _clean(name: str) -> str:
    for prefix in FSDP_PREFIXES:
        name = name.replace(prefix, "")
    return name


def _without_adapter_name(key: str, name: str) -> str:
    """peft's checkpoint name for a model key (`q_proj.lora_A.default.weight` -> `q_proj.lora_A.weight`). peft does
    this itself, but under FSDP v1 the LoRA layers are wrapped too (`lora_A.default._fsdp_wrapped_module.weight`),
    so its rule only applies once the wrapper segments are gone."""
    if key.endswith(f".{name}"):
        return key.removesuffix(f".{name}")
    head, _, suffix = key.rpartition(".")
    return f"{head.removesuffix(f'.{name}')}.{suffix}" if head.endswith(f".{name}") else key


def _as_model_names(model, state: dict) -> dict:
    """Key the state dict by the model's own (wrapped) names: peft finds adapter tensors by module name."""
    raw = {_clean(n): n for n, _ in model.named_parameters()}
    raw.update({_clean(n): n for n, _ in model.named_buffers()})
    return {raw.get(k, k): v for k, v in state.items()}


def save_adapter(model, state: dict, folder: Path) -> None:
    """Write a PEFT adapter folder from a gathered full state dict of a wrapped model.

    peft's own save picks adapter tensors by module names, which FSDP v1 (`_fsdp_wrapped_module.`)
    and FSDP-native activation checkpointing (`_checkpoint_wrapped_module.`) change: it would write an
    adapter with zero tensors. Here peft selects from names aligned with the model, and the file gets
    the clean names `PeftModel.from_pretrained` expects.
    """
    import copy

    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    name = getattr(model, "active_adapter", "default")
    chosen = get_peft_model_state_dict(model, state_dict=_as_model_names(model, state), adapter_name=name)
    save_file({_without_adapter_name(_clean(k), name): v.contiguous() for k, v in chosen.items()},
              str(folder / "adapter_model.safetensors"),
              metadata={"format": "pt"})
    config = copy.deepcopy(model.peft_config[name])
    config.inference_mode = True
    config.save_pretrained(str(folder))


def expected_from_full_state(model, state: dict, is_adapter: bool) -> dict[str, tuple[int, ...]]:
    """Expected names/shapes for a sharded model, from its gathered full state dict.

    For an adapter the names are the model's own trainable parameters (not peft's filtering, which
    is what goes wrong under FSDP v1), so an empty or partial adapter fails the check.
    """
    if not is_adapter:
        return {k: tuple(v.shape) for k, v in state.items()}
    from peft import get_peft_model_state_dict

    trainable = {_clean(n) for n, p in model.named_parameters() if p.requires_grad}
    name = getattr(model, "active_adapter", "default")
    chosen = get_peft_model_state_dict(model, state_dict=_as_model_names(model, state), adapter_name=name)
    chosen = {_without_adapter_name(_clean(k), name): v for k, v in chosen.items()}
    if len(chosen) >= len(trainable):
        return {k: tuple(v.shape) for k, v in chosen.items()}
    # peft picked fewer tensors than the model trains: expect them all, so the check fails loudly
    return {n: tuple(state[n].shape) if n in state else (-1,) for n in trainable}


def converts_initial(plan) -> bool:
    """peft.init pissa/olora moved part of the base weights into the adapter: the final adapter is converted
    against the initial one, so it applies to the original base (at twice the rank)."""
    from ftune.methods.lora import MOVES_BASE_WEIGHTS

    peft = plan.recipe.peft
    return peft.method == "lora" and peft.init in MOVES_BASE_WEIGHTS


def save_initial_adapter(model, folder: Path) -> None:
    """Save the adapter as initialised (before any step), for the conversion at the end (rank 0 only)."""
    name = getattr(model, "active_adapter", "default")
    config = model.peft_config[name]
    init, config.init_lora_weights = config.init_lora_weights, True  # a plain LoRA when loaded back
    try:
        model.save_pretrained(str(folder))
    finally:
        config.init_lora_weights = init


def save_converted(model, initial: Path, folder: Path) -> None:
    """The trained PiSSA/OLoRA adapter as a plain LoRA of twice the rank on the original base (peft's conversion).

    peft 0.21's conversion keeps only the lora_A/lora_B tensors: the adapter's other tensors (trainable token
    rows, resized embeddings, modules_to_save) are put back unchanged, since the conversion does not touch them.
    """
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file, save_file

    model.save_pretrained(str(folder), path_initial_model_for_weight_conversion=str(initial))
    path = folder / "adapter_model.safetensors"
    converted = load_file(str(path))
    kept = {k: v.detach().contiguous() for k, v in get_peft_model_state_dict(model).items()
            if k not in converted and ".lora_" not in k}
    if kept:
        save_file({**converted, **kept}, str(path), metadata={"format": "pt"})


def _doubled_rank(expected: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Shapes after peft's conversion to a plain LoRA: lora_A (r, in) -> (2r, in), lora_B (out, r) -> (out, 2r)."""
    out = {}
    for name, shape in expected.items():
        if ".lora_A." in name:
            shape = (2 * shape[0], *shape[1:])
        elif ".lora_B." in name:
            shape = (shape[0], 2 * shape[1], *shape[2:])
        out[name] = shape
    return out


REFERENCE_ADAPTER = "ref"
"""TRL's frozen copy of a continued adapter, the preference objectives' reference: not part of what was trained."""


def save_final(trainer, plan, tokenizer) -> dict:
    """Write final/ (adapter or model + tokenizer), verify it, then mark it complete. Returns a summary.

    Under FSDP the Trainer's save_model writes nothing with a sharded state-dict type, so every rank
    joins in gathering the full state dict and rank 0 writes a normal HF/PEFT folder from it.
    """
    final = plan.run.final
    is_adapter = plan.recipe.peft.uses_peft_library
    model = trainer.model
    main = trainer.is_world_process_zero()
    if getattr(trainer, "is_fsdp_enabled", False):
        acc = trainer.accelerator
        state = acc.get_state_dict(trainer.model_wrapped)  # collective: every rank must call it
        state = {_clean(k): v for k, v in state.items()}
        expected = {}
        unwrapped = acc.unwrap_model(trainer.model_wrapped)
        bad = first_nonfinite_of(state.items(), packed_weights(unwrapped))
        if main and bad is None:
            expected = expected_from_full_state(unwrapped, state, is_adapter)
            if is_adapter:
                save_adapter(unwrapped, state, final)
            else:
                unwrapped.save_pretrained(str(final), state_dict=state, safe_serialization=True)
        acc.wait_for_everyone()
        if main and bad is not None:  # raised after the barrier: no rank waits for rank 0 forever
            raise nonfinite(f"parameter {bad}", trainer.state.global_step)
    elif converts_initial(plan):
        bad = first_nonfinite(model, trainable_only=is_adapter)
        if bad is not None:  # never write final/ from non-finite weights
            raise nonfinite(f"parameter {bad}", trainer.state.global_step)
        expected = _doubled_rank(expected_tensors(model, is_adapter)) if main else {}
        if main:
            save_converted(model, plan.run.initial_adapter, final)
    else:
        bad = first_nonfinite(model, trainable_only=is_adapter)
        if bad is not None:  # never write final/ from non-finite weights
            raise nonfinite(f"parameter {bad}", trainer.state.global_step)
        if is_adapter and REFERENCE_ADAPTER in (getattr(model, "peft_config", None) or {}):
            model.delete_adapter(REFERENCE_ADAPTER)  # peft would save it too, as final/ref/
        expected = expected_tensors(model, is_adapter) if main else {}
        trainer.save_model(str(final))
    if not main:
        return {}
    tokenizer.save_pretrained(str(final))
    verify(final, expected, is_adapter=is_adapter)
    meta = {
        "recipe": plan.recipe.name,
        "method": plan.recipe.peft.method,
        "task": plan.recipe.model.task,
        "base_model": plan.recipe.model.path,
        "adapter": is_adapter,
        "quantization": plan.recipe.quantization.model_dump() if plan.recipe.quantization else None,
        "tensors": len(expected),
    }
    (final / RECORD).write_text(json.dumps(meta, indent=2) + "\n")
    mark_complete(final, {"tensors": len(expected)})
    return meta


# ------------------------------------------------------------------------------ checkpoints
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
        return {_clean(k.removeprefix("model.")): tuple(v.shape) for k, v in state.items() if hasattr(v, "shape")}
    if not dcp_dirs:
        return saved_tensors(folder)
    from torch.distributed.checkpoint import FileSystemReader

    shapes: dict[str, tuple[int, ...]] = {}
    for d in dcp_dirs:
        meta = FileSystemReader(str(d)).read_metadata()
        for name, item in meta.state_dict_metadata.items():
            if hasattr(item, "size"):
                shapes[_clean(name.removeprefix("model."))] = tuple(item.size)
    return shapes


PROMPT_EMBEDDINGS = "prompt_embeddings"
"""peft saves a prompt-learning method's encoder (prefix tuning) as this one tensor (its output when projected)."""


def _adapter_saved_name(param_name: str) -> str:
    """The name peft gives a trainable adapter parameter when it saves it: no adapter name, no
    `modules_to_save` wrapper (`score.modules_to_save.default.weight` -> `score.weight`), and prompt
    encoders as `prompt_embeddings`."""
    name = _clean(param_name).replace(".default", "").replace(".modules_to_save", "")
    if name.startswith("prompt_encoder.") or ".prompt_encoder." in name:
        return PROMPT_EMBEDDINGS
    return name


def verify_checkpoint(folder: Path, model, is_adapter: bool) -> None:
    """Read a just-written checkpoint back and compare names (and shapes, where they are global).

    Called on rank 0 before the checkpoint is marked complete: a checkpoint that would restore
    nothing (or part of the model) is an error, not a resumable checkpoint.
    """
    found = checkpoint_tensors(folder)
    if is_adapter:  # full adapter checkpoints keep the adapter name; sharded ones and final/ drop it
        found = {k.replace(".default", ""): v for k, v in found.items()}
        wanted = {_adapter_saved_name(n): p for n, p in model.named_parameters() if p.requires_grad}
    else:
        wanted = {_clean(n): p for n, p in model.named_parameters()}
    if not found:
        raise RunError(f"checkpoint check failed: {folder} holds no model tensors",
                       hint="the checkpoint would restore nothing; report this with the run dir")
    missing = sorted(n for n in wanted if n not in found)
    # FSDP v1 flattens the local shard (1-D views), so only DTensor / plain shapes are comparable
    wrong = sorted(n for n, p in wanted.items()
                   if n in found and n != PROMPT_EMBEDDINGS and p.dim() > 1 and tuple(p.shape) != found[n])
    if missing or wrong:
        detail = "; ".join(part for part in (
            f"missing {missing[:5]}" if missing else "",
            f"wrong shapes {[(n, found[n], tuple(wanted[n].shape)) for n in wrong[:3]]}" if wrong else "",
        ) if part)
        raise RunError(f"checkpoint check failed for {folder}: {detail}",
                       hint="the checkpoint does not match the model being trained; it is not marked complete")
