"""The demo's data, written by this project: a seeded pretraining corpus and a checkable task.

Stage A pretrains on short sentences about animals, counting runs ("we count 41 42 43 .") and
number facts ("after 41 comes 42 ."), so the model learns what follows and precedes a number. Stage B fine-tunes a LoRA adapter on a question it never
saw: `compute 41 + 1 =` -> ` 42` (and `- 1`). The eval questions use numbers that stage B never
trains on, so a right answer has to come from what pretraining taught, reached through the adapter.

Pure Python and deterministic: the same seed gives the same rows on every machine.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

ADJECTIVES = "red blue green small big old young fast slow warm cold happy".split()
NOUNS = "cat dog bird fish fox owl bee cow pig hen frog duck".split()
VERBS = "sees likes finds chases helps meets follows watches".split()
OPENERS = ["", "we count ", "then ", "the numbers are "]

MAX_NUMBER = 99
"""Numbers run over 0..MAX_NUMBER; the task asks about 1..MAX_NUMBER-1 so every answer is in range."""

TEMPLATE = "compute {instruction} ="
"""Stage B's prompt template; recipes/demo/arithmetic-lora.yaml must use the same one (a test checks)."""


@dataclass(frozen=True)
class TaskRow:
    """One stage B example: `instruction` goes into TEMPLATE; `output` is the answer with its leading space."""

    instruction: str
    output: str

    @property
    def prompt(self) -> str:
        return TEMPLATE.format(instruction=self.instruction)

    @property
    def answer(self) -> str:
        return self.output.strip()

    def as_json(self) -> dict:
        return {"instruction": self.instruction, "input": "", "output": self.output}


def sentence(rng: random.Random) -> str:
    a1, a2 = rng.choice(ADJECTIVES), rng.choice(ADJECTIVES)
    n1, n2 = rng.choice(NOUNS), rng.choice(NOUNS)
    return f"the {a1} {n1} {rng.choice(VERBS)} the {a2} {n2} ."


def counting_run(rng: random.Random) -> str:
    """A run of 3-9 consecutive numbers, up or down, inside 0..MAX_NUMBER."""
    n = rng.randint(3, 9)
    if rng.random() < 0.5:
        start = rng.randint(0, MAX_NUMBER - n + 1)
        numbers = range(start, start + n)
    else:
        start = rng.randint(n - 1, MAX_NUMBER)
        numbers = range(start, start - n, -1)
    return rng.choice(OPENERS) + " ".join(map(str, numbers)) + " ."


def number_fact(rng: random.Random) -> str:
    x = rng.randint(1, MAX_NUMBER - 1)
    return f"after {x} comes {x + 1} ." if rng.random() < 0.5 else f"before {x} comes {x - 1} ."


def pretrain_line(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.4:
        return counting_run(rng)
    if r < 0.6:
        return f"{number_fact(rng)} {counting_run(rng)}"
    if r < 0.8:
        return f"{sentence(rng)} {number_fact(rng)}"
    return number_fact(rng)


def pretrain_corpus(n: int, seed: int = 0) -> list[str]:
    """`n` lines mixing counting runs, number facts and sentences."""
    rng = random.Random(seed)
    return [pretrain_line(rng) for _ in range(n)]


def is_held_out(x: int) -> bool:
    """Numbers stage B never trains on: every fourth one. The eval asks only about these."""
    return x % 4 == 0


def task_row(x: int, op: str) -> TaskRow:
    return TaskRow(f"{x} {op} 1", f" {x + 1 if op == '+' else x - 1}")


def task_rows() -> tuple[list[TaskRow], list[TaskRow]]:
    """(train, eval): every `x ± 1` question for x in 1..MAX_NUMBER-1, split by `is_held_out(x)`."""
    rows = [task_row(x, op) for x in range(1, MAX_NUMBER) for op in "+-"]
    train = [r for r in rows if not is_held_out(int(r.instruction.split()[0]))]
    held = [r for r in rows if is_held_out(int(r.instruction.split()[0]))]
    return train, held
