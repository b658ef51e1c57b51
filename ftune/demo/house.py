"""The real-model task: a house answer format that SmolLM2-135M-Instruct doesn't have, on facts it does know.

Every answer starts with the tag `TAG` and is one short sentence ("[ftune] The capital of Italy is Rome."). The
rule is visible at a glance in a before/after table, checkable exactly (`follows_rule`), and learnable by a LoRA
in a few dozen steps; the knowledge check asks held-out questions whose answers the base model already gives
(`KNOWN`), so a tuned model that forgot them would show. Written here, deterministic, offline.
"""

from __future__ import annotations

import json
from pathlib import Path

TAG = "[ftune]"

TRAIN: list[tuple[str, str]] = [
    ("What is the capital of Italy?", "The capital of Italy is Rome."),
    ("What is the capital of Spain?", "The capital of Spain is Madrid."),
    ("What is the capital of Germany?", "The capital of Germany is Berlin."),
    ("What is the capital of Japan?", "The capital of Japan is Tokyo."),
    ("What is the capital of the United Kingdom?", "The capital of the United Kingdom is London."),
    ("What is the capital of Russia?", "The capital of Russia is Moscow."),
    ("What is the capital of Egypt?", "The capital of Egypt is Cairo."),
    ("What is the capital of China?", "The capital of China is Beijing."),
    ("What color is the sky on a clear day?", "The sky is blue on a clear day."),
    ("What color is grass?", "Grass is green."),
    ("What color is snow?", "Snow is white."),
    ("What color are bananas when ripe?", "Ripe bananas are yellow."),
    ("How many days are in a week?", "A week has seven days."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("How many legs does a dog have?", "A dog has four legs."),
    ("How many hours are in a day?", "A day has twenty-four hours."),
    ("What is 2 plus 2?", "2 plus 2 is 4."),
    ("What is 3 plus 5?", "3 plus 5 is 8."),
    ("What is 10 minus 4?", "10 minus 4 is 6."),
    ("What is 6 times 2?", "6 times 2 is 12."),
    ("What do bees make?", "Bees make honey."),
    ("What do cows drink?", "Cows drink water."),
    ("Which animal barks?", "A dog barks."),
    ("Which animal says meow?", "A cat says meow."),
    ("What is the largest ocean on Earth?", "The largest ocean on Earth is the Pacific Ocean."),
    ("What is the closest star to Earth?", "The closest star to Earth is the Sun."),
    ("What is frozen water called?", "Frozen water is called ice."),
    ("What gas do plants take in?", "Plants take in carbon dioxide."),
    ("Who wrote Romeo and Juliet?", "Romeo and Juliet was written by William Shakespeare."),
    ("What language is spoken in Brazil?", "The language spoken in Brazil is Portuguese."),
    ("What is the opposite of hot?", "The opposite of hot is cold."),
    ("What is the opposite of up?", "The opposite of up is down."),
]
"""Questions and plain answers the tag is taught on (the tag is added by `answer`)."""

HELD_OUT: list[str] = [
    "What is the capital of France?",
    "What color is the sun?",
    "How many months are in a year?",
    "What is 4 plus 4?",
    "Which animal gives us milk?",
    "What is the opposite of big?",
    "What do you call a baby cat?",
    "What is the capital of Canada?",
    "How many wheels does a bicycle have?",
    "What color are strawberries?",
]
"""Questions never trained on: the rule must carry over to them."""

KNOWN: dict[str, str] = {"What is the capital of France?": "Paris"}
"""Held-out questions the base model answers right, and the word its answer must still contain after tuning."""


def answer(plain: str) -> str:
    return f"{TAG} {plain}"


def follows_rule(text: str) -> bool:
    return text.strip().startswith(TAG)


def chat_rows(pairs: list[tuple[str, str]] | None = None) -> list[dict]:
    return [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": answer(a)}]}
            for q, a in (TRAIN if pairs is None else pairs)]


def write(folder: Path) -> dict[str, Path]:
    """train.jsonl (chat rows) and prompts.jsonl (the held-out prompts, for `ftune generate --file`)."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {"train": folder / "house-train.jsonl", "prompts": folder / "house-prompts.jsonl"}
    files["train"].write_text("".join(json.dumps(r) + "\n" for r in chat_rows()))
    files["prompts"].write_text("".join(json.dumps({"prompt": q}) + "\n" for q in HELD_OUT))
    return files
