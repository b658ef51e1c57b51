"""Build the demo's assets offline: JSONL data, a byte-level BPE tokenizer and a tiny Llama config.

Everything lands in `<workdir>/recipes/demo/assets/` (git-ignored), where the demo recipes read it.
Nothing is downloaded: the tokenizer is trained on the demo's own text and the model is built from a
config (stage A starts it from random weights with `model.init: random`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ftune.demo import tasks

ASSETS = Path("recipes/demo/assets")
"""Relative to the working directory, like every relative path in a recipe."""

# The model: ~0.7M parameters, enough to learn the number facts in a few hundred steps on two cores.
MODEL_SHAPE = {"hidden_size": 128, "intermediate_size": 256, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2}
VOCAB_SIZE = 512
CORPUS_LINES = 6000
CORPUS_EVAL_LINES = 64


@dataclass(frozen=True)
class Assets:
    root: Path

    @property
    def model(self) -> Path:
        return self.root / "tiny-llama"

    @property
    def pretrain_train(self) -> Path:
        return self.root / "pretrain.train.jsonl"

    @property
    def pretrain_eval(self) -> Path:
        return self.root / "pretrain.eval.jsonl"

    @property
    def task_train(self) -> Path:
        return self.root / "arithmetic.train.jsonl"

    @property
    def task_eval(self) -> Path:
        return self.root / "arithmetic.eval.jsonl"

    @property
    def task_prompts(self) -> Path:
        """The RL stage's data: stage B's training questions as `format: prompt` rows (the held-out ones never)."""
        return self.root / "arithmetic.prompts.jsonl"


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def read_task_rows(path: Path) -> list[tasks.TaskRow]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [tasks.TaskRow(r["instruction"], r["output"]) for r in rows]


def build(workdir: Path, seed: int = 0) -> Assets:
    """Write the data, train the tokenizer and save the model folder; returns where they are."""
    from transformers import AutoTokenizer

    from ftune.tiny import build_tiny_llama, train_tokenizer

    assets = Assets(workdir / ASSETS)
    assets.root.mkdir(parents=True, exist_ok=True)
    corpus = tasks.pretrain_corpus(CORPUS_LINES + CORPUS_EVAL_LINES, seed=seed)
    write_jsonl(assets.pretrain_train, [{"text": t} for t in corpus[:CORPUS_LINES]])
    write_jsonl(assets.pretrain_eval, [{"text": t} for t in corpus[CORPUS_LINES:]])
    train_rows, eval_rows = tasks.task_rows()
    write_jsonl(assets.task_train, [r.as_json() for r in train_rows])
    write_jsonl(assets.task_eval, [r.as_json() for r in eval_rows])
    write_jsonl(assets.task_prompts, [{"prompt": r.prompt, "answer": r.answer} for r in train_rows])

    # The tokenizer sees the task's prompts too, so `compute`, `+`, `=` are whole tokens like the numbers.
    texts = corpus + [r.prompt + r.output for r in train_rows + eval_rows]
    tok_dir = assets.root / "tokenizer"
    train_tokenizer(texts, tok_dir, vocab_size=VOCAB_SIZE)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    build_tiny_llama(assets.model, tokenizer, max_positions=128, seed=seed, **MODEL_SHAPE)
    return assets
