"""The colour task the vision tests learn: 28x28 images of one colour, "what colour", the colour's name."""

from __future__ import annotations

import json
from pathlib import Path

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220)}


def colour_rows(folder: Path, rows: int, blank: bool = False, sides: tuple[int, ...] = (28,)) -> Path:
    """`rows` vision-chat rows in `folder`/data.jsonl, the colours in turn (chance is 1/3 whatever the model
    guesses), each image in `folder`/img; `blank` draws them all white (the control); `sides`: the squares' sizes
    in turn (several: a batch mixes image sizes, for a family with dynamic resolution)."""
    from PIL import Image

    (folder / "img").mkdir()
    out = []
    for i in range(rows):
        name = sorted(COLOURS)[i % 3]
        side = sides[i % len(sides)]
        Image.new("RGB", (side, side), (255, 255, 255) if blank else COLOURS[name]).save(folder / "img" / f"{i}.png")
        out.append({"messages": [
            {"role": "user", "content": [{"type": "image", "image": f"img/{i}.png"},
                                         {"type": "text", "text": "what colour"}]},
            {"role": "assistant", "content": name}]})
    path = folder / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in out))
    return path
