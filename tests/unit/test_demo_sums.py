"""Stage D's task (`ftune.demo.sums`): seeded, held out, scored by the `numeric` reward it trains on."""

from __future__ import annotations

import json

import yaml

from ftune.demo import sums
from tests.e2e.test_demo import REPO


def test_pairs_are_deterministic_disjoint_and_cover_every_sum():
    train, held = sums.pairs()
    assert (len(train), len(held)) == (57, 24) and sums.pairs() == (train, held)
    assert not set(train) & set(held) and len(set(train) | set(held)) == 81


def test_the_files_are_prompt_rows_with_the_sum(tmp_path):
    files = sums.write(tmp_path)
    rows = [json.loads(line) for line in files["train"].read_text().splitlines()]
    held = [json.loads(line) for line in files["held_out"].read_text().splitlines()]
    assert len(rows) == 57 and len(held) == 24
    assert rows[0]["prompt"][0]["role"] == "user" and rows[0]["prompt"][0]["content"].startswith("What is ")
    a, b = sums.pairs()[0][0]
    assert rows[0] == {"prompt": [{"role": "user", "content": f"What is {a} plus {b}?"}], "answer": str(a + b)}
    assert not {r["prompt"][0]["content"] for r in rows} & {r["prompt"][0]["content"] for r in held}


def test_score_is_the_numeric_reward_on_the_last_number():
    held = [(3, 7), (2, 2), (9, 9), (1, 1)]
    answers = ["[ftune] 3 plus 7 is 10.", "2 + 2 = 5", "To solve this problem, we", "1 plus 1 is 2, not 3"]
    assert sums.score(answers, held) == 0.25  # only the first: the last number must be the sum
    assert sums.score(["[ftune] 2 plus 2 is 4."], [(2, 2)]) == 1.0


def test_the_recipe_trains_on_the_files_the_stage_writes_from_stage_c():
    recipe = yaml.safe_load((REPO / "recipes/demo/smollm2-sums-grpo.yaml").read_text())
    assert recipe["data"]["train"][0]["path"] == "recipes/demo/assets/sums.prompts.jsonl"
    assert recipe["model"]["path"] == "runs/demo-smollm2-house/final"
    assert recipe["output"]["dir"] == str(sums.RUN_DIR)
    assert recipe["train"]["rl"]["max_completion_length"] == sums.NEW_TOKENS
    assert recipe["train"]["rl"]["rewards"] == [{"name": "numeric"}]
