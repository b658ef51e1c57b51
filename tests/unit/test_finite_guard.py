"""The finiteness guard (checkpoints, final/) skips bitsandbytes' packed 4-bit weights: their uint8 bytes are stored
as bf16/fp32 (`quant_storage`) and can read as NaN. Under FSDP activation checkpointing the module names gain
`_checkpoint_wrapped_module.`, while a gathered state dict is keyed by clean names: the skip must match both."""

from __future__ import annotations

import pytest

from ftune.worker.finite import first_nonfinite, first_nonfinite_of, packed_weights


@pytest.fixture(params=["bfloat16", "float32"])
def qlora_wrapped(request, tiny_model_dir):
    """4-bit tiny Llama + LoRA, decoder layers in checkpoint wrappers (as FSDP activation checkpointing leaves them),
    every packed weight holding a NaN bit pattern (a legal byte pair for a packed weight)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
    from transformers import AutoModelForCausalLM
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from ftune.plan.quantization import bnb_config
    from ftune.recipe.schema import QuantizationSection

    storage = request.param
    q = QuantizationSection(bits=4, compute_dtype=storage, quant_storage=storage)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=getattr(torch, storage),
                                                 quantization_config=bnb_config(q))
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "k_proj", "v_proj"]))
    apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, LlamaDecoderLayer))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("base_layer.weight") or "mlp" in name and name.endswith("proj.weight"):
                assert p.dtype == getattr(torch, storage)  # packed bytes in a float dtype
                p.view(-1)[0] = float("nan")
    return model


def test_packed_weights_are_named_as_the_state_dict_names_them(qlora_wrapped):
    packed = packed_weights(qlora_wrapped)
    assert len(packed) == 14  # 7 linears x 2 layers
    k_proj = "base_model.model.model.layers.0.self_attn.k_proj.base_layer.weight"
    assert k_proj in packed  # no `_checkpoint_wrapped_module.` segment
    assert any("_checkpoint_wrapped_module." in n for n, _ in qlora_wrapped.named_parameters())


def test_nan_bytes_in_packed_weights_are_no_alarm(qlora_wrapped):
    assert first_nonfinite(qlora_wrapped, trainable_only=False) is None
    assert first_nonfinite(qlora_wrapped, trainable_only=True) is None
    state = {n.replace("_checkpoint_wrapped_module.", ""): t for n, t in qlora_wrapped.state_dict().items()}
    assert first_nonfinite_of(state.items(), packed_weights(qlora_wrapped)) is None  # save_final's FSDP path


@pytest.mark.parametrize(("part", "trainable"), [("lora_A.default.weight", True), ("input_layernorm.weight", False)])
def test_a_real_nan_is_still_found(qlora_wrapped, part, trainable):
    import torch

    name, p = next((n, p) for n, p in qlora_wrapped.named_parameters() if n.endswith(part))
    with torch.no_grad():
        p.view(-1)[1] = float("inf")
    clean = name.replace("_checkpoint_wrapped_module.", "")
    assert first_nonfinite(qlora_wrapped, trainable_only=False) == clean
    assert first_nonfinite(qlora_wrapped, trainable_only=True) == (clean if trainable else None)
    state = dict(qlora_wrapped.state_dict())
    assert first_nonfinite_of(state.items(), packed_weights(qlora_wrapped)) == clean
