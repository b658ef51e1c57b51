"""QAT end to end (`quantization.qat`, torchao): a full fine-tune of the tiny Llama on a task with held-out
answers, trained once plain and once through int4 fake quantization. The QAT run, converted by `ftune merge` to
truly int4 weights, keeps the task, and its merged folder reloads with the greedy answers of the fake-quantized
model it trained. On this model int4 rounding never flips a trained answer, so post-training quantization keeps it
too: QAT *beating* PTQ is shown on the real model (tests/e2e/test_real_qat.py)."""

from __future__ import annotations

import json
import random

import pytest

from tests.e2e._util import base_recipe, ftune, write_recipe

pytest.importorskip("torchao")
pytestmark = pytest.mark.extended  # two runs and a merge, ~3 min on a loaded 2-core machine; cheap sibling:
# tests/unit/test_qat.py (prepare, convert and reload in process)

FIRST = "cat sat mat dog ran park birds sang songs rain sun wind".split()
SECOND = "people read books write code train models fine tune small networks learn".split()
"""Words the tiny tokenizer holds as one token each (with their leading space)."""
TEMPLATE = "the {instruction} is"
STEPS = 120
QAT = {"scheme": "int4-weight", "group_size": 64}


def _rows() -> tuple[list[dict], list[dict]]:
    """`the <first> <second> is` -> ` <first>`: every pair, a quarter held out (never trained on)."""
    rng = random.Random(0)
    pairs = [(c, n) for c in FIRST for n in SECOND]
    rng.shuffle(pairs)
    rows = [{"instruction": f"{c} {n}", "input": "", "output": f" {c}"} for c, n in pairs]
    cut = len(rows) // 4
    return rows[cut:], rows[:cut]


def _recipe(tmp_path, model_dir, name: str, **quant) -> dict:
    train, held = _rows()
    data = tmp_path / "copy.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in train))
    return base_recipe(
        model_dir, data, name=name,
        data={"train": [{"path": str(data), "format": "instruction", "template": TEMPLATE}], "eval": None,
              "max_seq_length": 16},
        peft={"method": "full"},
        train={"max_steps": STEPS, "learning_rate": 3e-3, "per_device_batch_size": 16, "logging_steps": 50,
               "seed": 7, "warmup_steps": 0},
        eval={"strategy": "no"}, checkpoint={"strategy": "no"},
        output={"dir": f"runs/{name}", "report_to": [], "loss_curve": False},
        **quant)


def _answers(model, tok, held) -> list[str]:
    from ftune.generation import generate

    prompts = [tok(TEMPLATE.format(instruction=r["instruction"]))["input_ids"] for r in held]
    return [c.text for c in generate(model, tok, prompts, stop_ids=[tok.eos_token_id], max_new_tokens=2,
                                     batch_size=64)]


def _accuracy(answers: list[str], held) -> float:
    return sum(a.split()[:1] == [r["output"].strip()] for a, r in zip(answers, held)) / len(held)


def test_qat_keeps_the_task_and_merge_writes_the_quantized_model(tmp_path, tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ftune.recipe.schema import QatSection
    from ftune.runtime import qat

    _, held = _rows()
    plain = write_recipe(tmp_path, _recipe(tmp_path, tiny_model_dir, "plain"), "plain.yaml")
    quant = write_recipe(tmp_path, _recipe(tmp_path, tiny_model_dir, "qat", quantization={"qat": QAT}), "qat.yaml")
    for recipe in (plain, quant):
        res = ftune("run", str(recipe), cwd=tmp_path)
        assert res.code == 0, res.text
    tok = AutoTokenizer.from_pretrained(tmp_path / "runs/plain/final")
    section = QatSection(**QAT)

    fp = AutoModelForCausalLM.from_pretrained(tmp_path / "runs/plain/final", dtype=torch.float32).eval()
    config = qat.quantization_config(fp, section)
    ptq = AutoModelForCausalLM.from_pretrained(tmp_path / "runs/plain/final", dtype=torch.float32,
                                               quantization_config=config).eval()
    fp_acc, ptq_acc = _accuracy(_answers(fp, tok, held), held), _accuracy(_answers(ptq, tok, held), held)

    res = ftune("merge", str(tmp_path / "runs/qat"), cwd=tmp_path)
    assert res.code == 0, res.text
    assert "int4-weight" in res.out
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "runs/qat/merged").eval()
    kinds = {type(m.weight).__name__ for n, m in merged.named_modules() if n.endswith("q_proj")}
    assert kinds == {"IntxUnpackedToInt8Tensor"}  # truly int4 (stored unpacked in int8), not fake-quantized
    fake = qat.prepare(AutoModelForCausalLM.from_pretrained(tmp_path / "runs/qat/final", dtype=torch.float32).eval(),
                       section)
    fake_answers, merged_answers = _answers(fake, tok, held), _answers(merged, tok, held)
    assert merged_answers == fake_answers
    qat_acc = _accuracy(merged_answers, held)
    print(f"held-out accuracy: fp32 {fp_acc:.2f}, int4 PTQ {ptq_acc:.2f}, int4 QAT+convert {qat_acc:.2f}")
    # Measured (2 cores, load ~12): fp32 1.00, int4 PTQ 1.00, QAT + convert 1.00. The tiny model's int4 noise
    # (~10% per weight, per row of 64) never flips a trained answer, so PTQ does not fall here and this test
    # can't show QAT beating it (tests/e2e/test_real_qat.py does, on the real model); it shows QAT + convert
    # keeping the task learned (docs/quantization.md)
    assert fp_acc >= 0.9 and qat_acc >= 0.9, (fp_acc, ptq_acc, qat_acc)
    assert qat_acc >= ptq_acc, (fp_acc, ptq_acc, qat_acc)
