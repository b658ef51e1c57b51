"""Writes colors.jsonl, the rows of the project's own lm-eval tasks (ftune_colors_mc, ftune_colors_gen): `python
tests/data/benchmarks/make_colors.py` rewrites it the same way (seeded). A thing's colour after a short phrase:
something a small model knows or can be taught, with a one-word answer both task types can score."""

import json
import random
from pathlib import Path

COLORS = {"sky": "blue", "grass": "green", "sun": "yellow", "blood": "red", "snow": "white", "coal": "black",
          "orange": "orange", "milk": "white", "leaf": "green", "sea": "blue", "banana": "yellow", "tomato": "red"}
WORDS = ["morning", "winter", "quiet", "old", "distant", "fresh", "summer", "evening", "northern", "bright"]

rng = random.Random(43)
rows = []
for word in WORDS:
    for thing, color in COLORS.items():
        others = sorted({c for c in COLORS.values() if c != color})
        choices = [color, *rng.sample(others, 3)]
        rng.shuffle(choices)
        rows.append({"question": f"In the {word} light, the color of the {thing} is", "choices": choices,
                     "answer": choices.index(color), "target": color})
rng.shuffle(rows)
Path(__file__).with_name("colors.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
