"""Quantization is refused where it can't work, before any weight loads: located recipe errors with hints,
plan-time checks of the environment, the device and the model's shapes, and the BitsAndBytesConfig built."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from ftune.errors import RecipeError
from ftune.recipe import load_recipe
from ftune.recipe.rules import check
from ftune.recipe.schema import Recipe
from ftune.models.meta import build_meta_model
from ftune.plan import quantization as quantize


def recipe(**sections) -> Recipe:
    data = {
        "name": "q",
        "model": {"path": "models/tiny"},
        "data": {"train": [{"path": "train.jsonl"}]},
        "train": {"max_steps": 10},
        "quantization": {"bits": 4},
    }
    data.update(sections)
    return Recipe.model_validate(data)


def paths(r: Recipe) -> list[str]:
    return [v.path for v in check(r)]


def write(tmp_path, body: str):
    path = tmp_path / "r.yaml"
    path.write_text(textwrap.dedent(body))
    return path


BASE = """\
name: q
model: {path: models/tiny, dtype: bfloat16}
data: {train: [{path: train.jsonl}]}
train: {max_steps: 10}
"""


# ----------------------------------------------------------------------------------------- rules
def test_plain_qlora_recipe_has_no_violations():
    assert check(recipe()) == []
    assert check(recipe(quantization={"bits": 8})) == []


@pytest.mark.parametrize("method", ["full", "freeze"])
def test_quantization_with_full_or_freeze_is_refused_once(method):
    peft = {"method": method} if method == "full" else {"method": "freeze", "trainable": ["lm_head"]}
    found = [v for v in check(recipe(peft=peft)) if v.path.startswith("quantization")]
    assert len(found) == 1  # lives in rules/core.py; quantization.py must not report it again
    assert method in found[0].message and "lora" in found[0].hint


def test_8bit_with_fsdp_is_refused_at_bits(tmp_path):
    path = write(tmp_path, BASE + "quantization: {bits: 8}\ndistributed: {strategy: fsdp, num_processes: 2}\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    [p] = err.value.problems
    assert p.path == "quantization.bits"
    assert "FSDP" in p.message and "bits: 4" in p.hint
    assert (p.location.line, p.location.column) == (5, 16)


def test_fsdp_qlora_needs_quant_storage_equal_to_model_dtype(tmp_path):
    path = write(tmp_path, BASE + "quantization: {bits: 4}\ndistributed: {strategy: fsdp, num_processes: 2}\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    [p] = err.value.problems
    assert p.path == "quantization.quant_storage"
    assert "got quant_storage 'uint8', model.dtype 'bfloat16'" in p.message
    assert p.hint == "set `quantization.quant_storage: bfloat16`"
    assert p.location.line == 5  # the quantization block (quant_storage itself was left at its default)


def test_fsdp_qlora_with_matching_quant_storage_passes(tmp_path):
    path = write(tmp_path, BASE + "quantization: {bits: 4, quant_storage: bfloat16}\n"
                 "distributed: {strategy: fsdp, num_processes: 2}\n")
    assert load_recipe(path).recipe.quantization.quant_storage == "bfloat16"


def test_fsdp_qlora_with_auto_dtype_asks_for_an_explicit_dtype():
    r = recipe(model={"path": "m"}, distributed={"strategy": "fsdp", "num_processes": 2})
    [v] = check(r)
    assert v.path == "model.dtype" and "'auto'" in v.message
    assert "quant_storage: bfloat16" in v.hint


def test_deepspeed_zero3_qlora_needs_quant_storage_too():
    r = recipe(model={"path": "m", "dtype": "bfloat16"},
               distributed={"strategy": "deepspeed", "num_processes": 2, "deepspeed": {"stage": 3}})
    assert paths(r) == ["quantization.quant_storage"]
    r2 = recipe(model={"path": "m", "dtype": "bfloat16"},
                distributed={"strategy": "deepspeed", "num_processes": 2, "deepspeed": {"stage": 2}})
    assert paths(r2) == []


def test_4bit_only_options_with_8bit_are_refused_each_at_its_key(tmp_path):
    path = write(tmp_path, BASE + "quantization:\n  bits: 8\n  type: fp4\n  double_quant: true\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    found = {p.path: p for p in err.value.problems}
    assert set(found) == {"quantization.type", "quantization.double_quant"}
    assert found["quantization.double_quant"].message.startswith("`double_quant: true` applies to 4-bit")
    assert found["quantization.type"].location.line == 7
    assert found["quantization.double_quant"].location.line == 8


def test_quantizing_a_random_init_model_is_refused():
    [v] = check(recipe(model={"path": "m", "init": "random"}))
    assert v.path == "quantization" and "init: random" in v.message


# ------------------------------------------------------------------------------- plan-time checks
def test_paged_optimizer_on_cpu_is_refused_with_the_unpaged_name():
    r = recipe(train={"max_steps": 10, "optimizer": "paged_adamw_8bit"})
    [p] = quantize.check_device(r, "cpu")
    assert p.path == "train.optimizer" and "silently runs it unpaged" in p.message
    assert p.hint == "use `train.optimizer: adamw_8bit` (same optimizer, unpaged) on CPU"
    assert quantize.check_device(r, "cuda") == []
    assert quantize.check_device(recipe(train={"max_steps": 1, "optimizer": "adamw_8bit"}), "cpu") == []


def test_missing_bitsandbytes_gives_an_install_hint(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    assert quantize.needs_bitsandbytes(recipe())
    [p] = quantize.check_environment(recipe())
    assert (p.path, p.message) == ("quantization", "quantization.bits: 4 needs bitsandbytes, which is not installed")
    assert "pip install 'ftune[quant]'" in p.hint
    r = recipe(quantization=None, train={"max_steps": 1, "optimizer": "adamw_8bit"})
    assert [(p.path, p.message) for p in quantize.check_environment(r)] == [
        ("train.optimizer", "train.optimizer: adamw_8bit needs bitsandbytes, which is not installed")]
    assert quantize.check_environment(recipe(quantization=None)) == []
    assert "pip install 'ftune[quant]'" in quantize.INSTALL_HINT


def test_missing_bitsandbytes_is_a_located_plan_error(monkeypatch, tmp_path):
    import importlib.util

    from ftune.plan.compile import compile_plan

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, BASE + "quantization: {bits: 4}\n")
    with pytest.raises(RecipeError) as err:
        compile_plan(load_recipe(path), check_inputs=False)
    [p] = [p for p in err.value.problems if p.path.startswith("quantization")]
    assert p.message == "quantization.bits: 4 needs bitsandbytes, which is not installed"
    assert "pip install 'ftune[quant]'" in p.hint
    assert p.location.line == 5


def test_old_bitsandbytes_is_reported(monkeypatch):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.41.3")
    assert [p.message for p in quantize.check_environment(recipe())] == [
        "quantization.bits: 4 needs bitsandbytes >= 0.45, found 0.41.3"]


def test_installed_bitsandbytes_passes():
    assert quantize.check_environment(recipe()) == []


def test_importing_quantize_is_light():
    code = "import sys, ftune.worker.quantize, ftune.runtime.quantized, ftune.plan.quantization; " \
           "print(sorted(m for m in ('torch', 'bitsandbytes', 'peft', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ------------------------------------------------------------------------------ model shape check
def _config(hidden: int, intermediate: int, heads: int = 4, kv: int = 2):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=300, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=1,
                       num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=False)


def test_4bit_cpu_shapes_multiple_of_32_pass():
    # vocab 300 is no multiple of 32, but lm_head stays unquantized
    assert quantize.check_model_config(recipe(), _config(64, 128), "cpu") == []


def test_4bit_cpu_shapes_not_multiple_of_32_are_refused_naming_dims():
    # hidden 64 is fine; k/v project to 2 kv heads x 16 = 32 (fine); intermediate 80 is not
    [p] = quantize.check_model_config(recipe(), _config(64, 80), "cpu")
    path, message, hint = p.path, p.message, p.hint
    assert path == "quantization.bits"
    assert "divisible by 32" in message
    assert "down_proj (80x64), gate_proj (64x80), up_proj (64x80)" in message
    assert hint.startswith("keep them unquantized with `quantization.skip_modules: [down_proj, gate_proj, up_proj]`")
    # ...and following the hint fixes it; GPU and 8-bit are not concerned
    fixed = recipe(quantization={"bits": 4, "skip_modules": ["down_proj", "gate_proj", "up_proj"]})
    assert quantize.check_model_config(fixed, _config(64, 80), "cpu") == []
    assert quantize.check_model_config(recipe(), _config(64, 80), "cuda") == []
    assert quantize.check_model_config(recipe(quantization={"bits": 8}), _config(64, 80), "cpu") == []


def test_4bit_cpu_every_layer_bad_hints_8bit_not_skipping_everything():
    [p] = quantize.check_model_config(recipe(), _config(48, 96), "cpu")
    message, hint = p.message, p.hint
    assert "k_proj (48x24)" in message and "q_proj (48x48)" in message
    assert hint == "use `quantization.bits: 8`, or run on a GPU"


def test_quantized_linears_match_what_transformers_quantizes(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    r = recipe(model={"path": str(tiny_model_dir)})
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, quantization_config=quantize.bnb_config(r.quantization),
                                                 dtype=torch.float32)
    loaded = {n for n, m in model.named_modules() if type(m).__name__ == "Linear4bit"}
    assert quantize.quantized_linears(r, model) == {}  # every quantizable Linear was swapped for Linear4bit
    meta = build_meta_model(r, model.config)
    assert set(quantize.quantized_linears(r, meta)) == loaded
    assert len(loaded) == 2 * 7 and "lm_head" not in loaded


# ---------------------------------------------------------------------------- BitsAndBytesConfig
def test_bitsandbytes_config_follows_the_section():
    import torch
    from transformers import BitsAndBytesConfig

    d = quantize.bnb_config(recipe(quantization={
        "bits": 4, "type": "fp4", "double_quant": True, "compute_dtype": "float16", "quant_storage": "bfloat16",
        "skip_modules": ["mlp"]}).quantization)
    q = BitsAndBytesConfig.from_dict(d)  # what transformers makes of the plan's dict
    assert q.load_in_4bit and not q.load_in_8bit
    assert (q.bnb_4bit_quant_type, q.bnb_4bit_use_double_quant) == ("fp4", True)
    assert (q.bnb_4bit_compute_dtype, q.bnb_4bit_quant_storage) == (torch.float16, torch.bfloat16)
    assert q.llm_int8_skip_modules == ["classifier", "lm_head", "mlp", "score"]  # the head stays skipped
    q8 = BitsAndBytesConfig.from_dict(quantize.bnb_config(recipe(quantization={"bits": 8}).quantization))
    assert q8.load_in_8bit and q8.llm_int8_skip_modules is None  # transformers' default skips the head
    assert quantize.bnb_config(None) is None


def test_classification_head_is_never_quantized():
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, num_labels=3)
    for q in ({"bits": 4}, {"bits": 4, "skip_modules": ["o_proj"]}):
        r = recipe(model={"path": "m", "task": "sequence-classification", "num_labels": 3}, quantization=q)
        names = quantize.quantized_linears(r, build_meta_model(r, config))
        assert "score" not in names and len(names) == (7 if "skip_modules" not in q else 6)
        assert quantize.check_model_config(r, config, "cpu") == []  # score is 64x3, but it stays unquantized
