"""Stage D of the demo: online RL (GRPO + LoRA) on the real SmolLM2-135M-Instruct, with a verifiable reward.

The task: "What is 3 plus 7?" for one-digit numbers, scored by the built-in `numeric` reward (1 when the last
number of the answer is the sum). GRPO continues stage C's adapter (`ftune.demo.real`): after stage C the model
answers short and ends its answers ("[ftune] 3 plus 7 is 10."), but often with the wrong sum, so the reward
measures correctness; the base model, asked greedily, starts with a preamble ("To solve this problem, ...") and
never ends within a short budget (a GRPO run from it stops on the every-completion-clipped guard). The 81 pairs
are split once, seeded: GRPO samples only the 57 training pairs; `measure` asks the 24 held-out ones greedily
after stage C (before) and after stage D, through the same loading and generation code as `ftune generate`, and
scores them with the same reward. Written here, deterministic, offline.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

STAGE = "smollm2-sums-grpo"
RUN_DIR = Path("runs/demo-smollm2-sums-grpo")
TEMPLATE = "What is {a} plus {b}?"
HELD_OUT_COUNT = 24
NEW_TOKENS = 16
"""The answer budget, in tokens: the recipe's `train.rl.max_completion_length`, and the held-out answers'."""
MIN_GAIN = 0.15
"""The held-out score must rise by at least this much (15 points) for the demo to count RL as learned."""


def pairs() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(training pairs, held-out pairs): every a, b in 1..9, shuffled with seed 0, the first 24 held out."""
    every = [(a, b) for a in range(1, 10) for b in range(1, 10)]
    random.Random(0).shuffle(every)
    return every[HELD_OUT_COUNT:], every[:HELD_OUT_COUNT]


def row(a: int, b: int) -> dict:
    """A `format: prompt` row: the question as a chat message (rendered with the model's template), the sum."""
    return {"prompt": [{"role": "user", "content": TEMPLATE.format(a=a, b=b)}], "answer": str(a + b)}


def write(folder: Path) -> dict[str, Path]:
    """sums.prompts.jsonl (the training prompts GRPO samples) and sums.heldout.jsonl (never trained on)."""
    folder.mkdir(parents=True, exist_ok=True)
    train, held = pairs()
    files = {"train": folder / "sums.prompts.jsonl", "held_out": folder / "sums.heldout.jsonl"}
    for key, chosen in (("train", train), ("held_out", held)):
        files[key].write_text("".join(json.dumps(row(a, b)) + "\n" for a, b in chosen))
    return files


def score(answers: list[str], held: list[tuple[int, int]]) -> float:
    """The mean of the built-in `numeric` reward (the one GRPO trained on, its default tolerance) over the answers."""
    from ftune.rewards import NumericArgs, Sample
    from ftune.rewards.builtin import numeric

    reward = numeric(NumericArgs())
    return sum(reward(Sample("", text, (), answer=str(a + b))) for text, (a, b) in zip(answers, held)) / len(held)


def answers(target_arg: str, held: list[tuple[int, int]]) -> list[str]:
    """Greedy answers of the model (a base folder or a run dir) to the held-out questions, within the budget."""
    from ftune.infer.load import load_for_generation
    from ftune.infer.source import resolve

    lo = load_for_generation(resolve(target_arg, allow_model=True))
    return model_answers(lo.model, lo.tokenizer, held, lo.stop_ids)


def model_answers(model, tokenizer, pairs: list[tuple[int, int]], stop_ids=()) -> list[str]:
    """Greedy answers of a loaded model to "What is a plus b?" for each pair, within the budget."""
    from ftune.generation import encode_prompt, generate, model_prompt_format, stop_token_ids

    # The chat template the prompts were rendered with in training: a `format: prompt` run's own format reads as
    # plain text (its rows may hold strings or messages), so the tokenizer's template is named here.
    fmt = model_prompt_format(tokenizer)
    prompts = [encode_prompt(fmt, tokenizer, {"messages": row(a, b)["prompt"]}) for a, b in pairs]
    done = generate(model, tokenizer, prompts, stop_ids=stop_token_ids(tokenizer, fmt, stop_ids),
                    max_new_tokens=NEW_TOKENS, batch_size=len(prompts))
    return [c.text.strip() for c in done]


def measure(workdir: Path) -> dict:
    from ftune.demo import real

    run = workdir / RUN_DIR
    _, held = pairs()
    before, after = answers(str(workdir / real.RUN_DIR), held), answers(str(run), held)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rewards = [(m["step"], m["reward"]) for m in metrics if "reward" in m]
    return {
        "model": "SmolLM2-135M-Instruct, stage C's LoRA adapter continued with GRPO",
        "held_out_questions": len(held),
        "new_tokens": NEW_TOKENS,
        "steps": max((m.get("step", 0) for m in metrics), default=0),
        "reward": rewards,
        "reward_first": rewards[0][1] if rewards else None,
        "reward_last": rewards[-1][1] if rewards else None,
        "zero_std_groups": [(m["step"], m["frac_reward_zero_std"]) for m in metrics if "frac_reward_zero_std" in m],
        "score_before": score(before, held),
        "score_after": score(after, held),
        "samples": [{"prompt": TEMPLATE.format(a=a, b=b), "answer": a + b, "before": x, "after": y}
                    for (a, b), x, y in zip(held, before, after)],
    }


def learned(fig: dict) -> bool:
    return fig["score_after"] - fig["score_before"] >= MIN_GAIN


def report(fig: dict, console) -> bool:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"stage D: SmolLM2-135M-Instruct, GRPO on sums ({fig['steps']} steps), held-out greedy "
                        f"answers (first {fig['new_tokens']} tokens)", title_style="bold", show_lines=False)
    for col in ("held-out question", "sum", "before", "after"):
        table.add_column(col, overflow="fold")
    for s in fig["samples"][:8]:
        table.add_row(escape(s["prompt"]), str(s["answer"]), escape(s["before"]), escape(s["after"]))
    console.print(table)
    console.print("stage D reward curve (step: mean numeric reward of the answers sampled that step): "
                  + "  ".join(f"{step}: {value:.2f}" for step, value in fig["reward"]))
    console.print(f"held-out score (numeric reward, greedy, {fig['held_out_questions']} questions): "
                  f"{fig['score_before']:.0%} -> [bold]{fig['score_after']:.0%}[/bold] "
                  f"({fig['score_after'] - fig['score_before']:+.0%})")
    ok = learned(fig)
    if not ok:
        console.print(f"[bold red]stage D did not learn enough:[/bold red] needs the held-out score up by "
                      f"{MIN_GAIN:.0%} points")
    return ok
