"""Parameter names as files hold them: a wrapped model's names (FSDP units, checkpoint wrappers, torch.compile)
and peft's adapter names mapped to the clean names a saved folder, a checkpoint or a gathered state dict uses.
Every save, verification and finiteness check compares names through here."""

from __future__ import annotations

FSDP_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def clean(name: str) -> str:
    """A wrapped model's parameter name without the wrapper segments."""
    for prefix in FSDP_PREFIXES:
        name = name.replace(prefix, "")
    return name


def without_adapter_name(key: str, name: str) -> str:
    """peft's checkpoint name for a model key (`q_proj.lora_A.default.weight` -> `q_proj.lora_A.weight`). peft does
    this itself, but under FSDP v1 the LoRA layers are wrapped too (`lora_A.default._fsdp_wrapped_module.weight`),
    so its rule only applies once the wrapper segments are gone."""
    if key.endswith(f".{name}"):
        return key.removesuffix(f".{name}")
    head, _, suffix = key.rpartition(".")
    return f"{head.removesuffix(f'.{name}')}.{suffix}" if head.endswith(f".{name}") else key


def as_model_names(model, state: dict) -> dict:
    """Key the state dict by the model's own (wrapped) names: peft finds adapter tensors by module name."""
    raw = {clean(n): n for n, _ in model.named_parameters()}
    raw.update({clean(n): n for n, _ in model.named_buffers()})
    return {raw.get(k, k): v for k, v in state.items()}


def as_saved(model, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The names and shapes `save_pretrained` writes for a whole model's tensors `shapes` (named as the model names
    them): transformers 5 writes the layout the family was published in (its conversion mapping reverted: LLaVA's
    `model.language_model.x` is saved as `language_model.model.x`, `lm_head` as `language_model.lm_head`) and a tied
    weight once. Computed on meta tensors: nothing is copied."""
    import torch
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    state = {name: torch.empty(shape, device="meta") for name, shape in shapes.items()}
    if hasattr(model, "get_parameter_or_buffer"):
        state = revert_weight_conversion(model, remove_tied_weights_from_state_dict(state, model))
    return {name: tuple(t.shape) for name, t in state.items()}


PROMPT_EMBEDDINGS = "prompt_embeddings"
"""peft saves a prompt-learning method's encoder (prefix tuning) as this one tensor (its output when projected)."""


def adapter_saved_name(param_name: str) -> str:
    """The name peft gives a trainable adapter parameter when it saves it: no adapter name, no
    `modules_to_save` wrapper (`score.modules_to_save.default.weight` -> `score.weight`), and prompt
    encoders as `prompt_embeddings`."""
    name = clean(param_name).replace(".default", "").replace(".modules_to_save", "")
    if name.startswith("prompt_encoder.") or ".prompt_encoder." in name:
        return PROMPT_EMBEDDINGS
    return name
