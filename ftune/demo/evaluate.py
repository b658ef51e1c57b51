"""Before/after figures: metrics.jsonl of a run, and the task measured on the held-out questions.

The task figures load the models with plain transformers/peft, as a user would: answer loss is the
mean cross-entropy over the answer tokens (and end-of-sequence), tokenized exactly as ftune's
`instruction` format does (prompt alone, then the answer); accuracy is exact match of the greedy
continuation up to end-of-sequence, decoded and scored by the machinery of `ftune generate` and `eval.generate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ftune.demo.tasks import TaskRow
from ftune.rundir import read_metrics  # noqa: F401  (one reader of metrics.jsonl)


@dataclass(frozen=True)
class TaskScore:
    loss: float
    """Mean answer-token cross-entropy (what the run's eval_loss measures)."""
    accuracy: float
    """Fraction of questions answered exactly by greedy decoding."""
    samples: list[tuple[str, str, str]]
    """A few (prompt, expected, generated) triples to show."""


def series(records: list[dict], key: str) -> list[tuple[int, float]]:
    """(step, value) for every record that logged `key`, in order."""
    return [(r["step"], float(r[key])) for r in records if key in r]


def load_causal_lm(model_dir: Path, adapter_dir: Path | None = None):
    """A model folder, optionally with a peft adapter on top; eval mode, on CPU."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir))
    return model.eval()


def _encode(tokenizer, row: TaskRow) -> tuple[list[int], list[int]]:
    prompt = tokenizer(row.prompt, add_special_tokens=True)["input_ids"]
    answer = tokenizer(row.output, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return prompt, answer


def answer_loss(model, tokenizer, rows: list[TaskRow]) -> float:
    """Token-mean cross-entropy over the answers, every row in one batch (right-padded)."""
    import torch

    encoded = [_encode(tokenizer, r) for r in rows]
    width = max(len(p) + len(a) for p, a in encoded)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (p, a) in enumerate(encoded):
        n = len(p) + len(a)
        ids[i, :n] = torch.tensor(p + a)
        labels[i, len(p) : n] = torch.tensor(a)
        mask[i, :n] = 1
    with torch.no_grad():
        return float(model(input_ids=ids, attention_mask=mask, labels=labels).loss)


def greedy_answers(model, tokenizer, rows: list[TaskRow], max_new_tokens: int = 4) -> list[str]:
    """Greedy continuation of each prompt up to end-of-sequence, decoded as `ftune generate` and
    `eval.generate` decode (ftune.generation)."""
    from ftune.generation import generate

    prompts = [_encode(tokenizer, r)[0] for r in rows]
    completions = generate(model, tokenizer, prompts, stop_ids=[tokenizer.eos_token_id], max_new_tokens=max_new_tokens,
                           batch_size=len(rows))
    return [c.text for c in completions]


def score(model, tokenizer, rows: list[TaskRow], show: int = 4) -> TaskScore:
    from ftune.generation import exact_match

    answers = greedy_answers(model, tokenizer, rows)
    right = sum(exact_match(a, r.answer) for a, r in zip(answers, rows))
    step = max(1, len(rows) // show)
    samples = [(rows[i].prompt, rows[i].answer, answers[i]) for i in range(0, len(rows), step)][:show]
    return TaskScore(answer_loss(model, tokenizer, rows), right / len(rows), samples)
