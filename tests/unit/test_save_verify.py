"""Save checks: what peft/transformers really write passes verification; a file missing tensors fails."""

from __future__ import annotations

import pytest

from ftune.errors import RunError
from ftune.worker.verify import expected_tensors, verify, verify_checkpoint


def _peft(model_dir, config, cls_name="AutoModelForCausalLM"):
    import transformers
    from peft import get_peft_model

    return get_peft_model(getattr(transformers, cls_name).from_pretrained(model_dir), config)


def _configs():
    from peft import AdaptionPromptConfig, LoraConfig, PrefixTuningConfig

    return {
        "lora": LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
        "prefix": PrefixTuningConfig(num_virtual_tokens=4, task_type="CAUSAL_LM"),
        "prefix-projection": PrefixTuningConfig(num_virtual_tokens=4, prefix_projection=True, task_type="CAUSAL_LM"),
        "llama-adapter": AdaptionPromptConfig(adapter_len=4, adapter_layers=2, task_type="CAUSAL_LM"),
    }


@pytest.mark.parametrize("method", ["lora", "prefix", "prefix-projection", "llama-adapter"])
def test_adapter_checkpoints_and_final_pass(method, tmp_path, tiny_model_dir):
    model = _peft(tiny_model_dir, _configs()[method])
    expected = expected_tensors(model, is_adapter=True)
    model.save_pretrained(tmp_path)
    verify_checkpoint(tmp_path, model, is_adapter=True)
    verify(tmp_path, expected, is_adapter=True)


def test_classification_head_in_modules_to_save_passes(tmp_path, tiny_cls_model_dir):
    from peft import LoraConfig

    model = _peft(tiny_cls_model_dir, LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["score"],
                                                 task_type="SEQ_CLS"), "AutoModelForSequenceClassification")
    model.save_pretrained(tmp_path)
    verify_checkpoint(tmp_path, model, is_adapter=True)


def test_missing_tensor_fails_both_checks(tmp_path, tiny_model_dir):
    from safetensors.torch import load_file, save_file

    model = _peft(tiny_model_dir, _configs()["lora"])
    expected = expected_tensors(model, is_adapter=True)
    model.save_pretrained(tmp_path)
    file = tmp_path / "adapter_model.safetensors"
    tensors = load_file(str(file))
    dropped = sorted(tensors)[0]
    del tensors[dropped]
    save_file(tensors, str(file))
    with pytest.raises(RunError, match="missing"):
        verify_checkpoint(tmp_path, model, is_adapter=True)
    with pytest.raises(RunError, match="missing"):
        verify(tmp_path, expected, is_adapter=True)


def test_full_model_checkpoint_passes(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.save_pretrained(tmp_path)
    verify_checkpoint(tmp_path, model, is_adapter=False)


def test_wrong_shapes_and_unexpected_tensors_fail_with_what_differs(tmp_path, tiny_model_dir):
    """final/ and a checkpoint share one comparison: a wrong shape fails both; an unexpected tensor fails a full
    model's final/ only (an adapter's folder may hold more than the trainable names, a checkpoint optimizer keys)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    expected = expected_tensors(model, is_adapter=False)
    tensors = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    name = "model.layers.0.self_attn.q_proj.weight"
    tensors[name] = torch.zeros(3, 3)
    tensors["stray.weight"] = torch.zeros(2)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(RunError) as final:
        verify(tmp_path, expected, is_adapter=False)
    assert f"wrong shapes [('{name}', (3, 3), (64, 64))]" in str(final.value)
    assert "unexpected ['stray.weight']" in str(final.value) and "missing" not in str(final.value)
    with pytest.raises(RunError) as checkpoint:
        verify_checkpoint(tmp_path, model, is_adapter=False)
    assert f"wrong shapes [('{name}', (3, 3), (64, 64))]" in str(checkpoint.value)
    assert "unexpected" not in str(checkpoint.value)
