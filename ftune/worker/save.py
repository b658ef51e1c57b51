"""Save `final/` — a normal HF model or PEFT adapter folder plus the tokenizer — then verify it (`verify`) and
only then write the completion marker. Under FSDP every rank gathers the full state dict and rank 0 writes it;
PiSSA/OLoRA adapters are converted against the initial adapter first.
"""

from __future__ import annotations

import json
from pathlib import Path

from ftune.adapter import RECORD
from ftune.rundir import mark_complete
from ftune.worker.finite import first_nonfinite, first_nonfinite_of, packed_weights
from ftune.worker.names import as_model_names, clean, without_adapter_name
from ftune.worker.stop import nonfinite
from ftune.worker.verify import expected_from_full_state, expected_tensors, verify

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
    chosen = get_peft_model_state_dict(model, state_dict=as_model_names(model, state), adapter_name=name)
    save_file({without_adapter_name(clean(k), name): v.contiguous() for k, v in chosen.items()},
              str(folder / "adapter_model.safetensors"),
              metadata={"format": "pt"})
    config = copy.deepcopy(model.peft_config[name])
    config.inference_mode = True
    config.save_pretrained(str(folder))


def converts_initial(plan) -> bool:
    """peft.init pissa/olora moved part of the base weights into the adapter: the final adapter is converted
    against the initial one, so it applies to the original base (at twice the rank)."""
    return plan.recipe.peft.moves_base_weights


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
        state = {clean(k): v for k, v in state.items()}
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
        "quantization": plan.recipe.kbit.model_dump() if plan.recipe.kbit else None,
        "qat": plan.recipe.qat.model_dump() if plan.recipe.qat else None,  # final/ holds the unquantized weights
        "tensors": len(expected),
    }
    (final / RECORD).write_text(json.dumps(meta, indent=2) + "\n")
    mark_complete(final, {"tensors": len(expected)})
    return meta
