"""The demo's figures as README.md and docs/demo.md quote them: one source, `docs/demo-summary.json`.

`python -m ftune.demo.figures runs/demo-summary.json` copies a measured summary (what `make demo` wrote) to
docs/demo-summary.json and rewrites the marked blocks of both pages from it; tests/unit/test_demo_figures.py
fails when a page's block is not what the committed summary gives, so no figure is typed by hand.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUMMARY = REPO / "docs" / "demo-summary.json"
PAGES = (REPO / "README.md", REPO / "docs" / "demo.md")
BEGIN = "<!-- demo-figures: generated from docs/demo-summary.json by `python -m ftune.demo.figures`; do not edit -->"
END = "<!-- /demo-figures -->"


def markdown(summary: dict) -> str:
    """The block: stage C's before/after table on held-out questions, stage D's held-out score and reward curve
    (or the toy stages B and B2 of a `--no-real` run), timings and date."""
    real, rl = summary.get("real") or {}, summary.get("rl_real") or {}
    t = summary["timings_s"]
    lines = []
    if "samples" in real:
        lines += [f"Stage C, LoRA on SmolLM2-135M-Instruct ({real['steps']} steps, 32 chat rows): answers in the "
                  f"house format `[ftune] ...` on **{real['rule_before']:.0%} → {real['rule_after']:.0%}** of "
                  f"{real['held_out_prompts']} held-out questions; the fact the base knew kept "
                  f"({real['knowledge_before']:.0%} → {real['knowledge_after']:.0%}). Greedy answers:", "",
                  "| held-out question | before | after |", "|---|---|---|"]
        lines += [f"| {s['prompt']} | {_cell(s['before'])} | {_cell(s['after'])} |" for s in real["samples"][:5]]
        lines.append("")
    if "samples" in rl:
        curve = ", ".join(f"{value:.2f}" for _, value in rl["reward"])
        lines += [f"Stage D, GRPO with the `numeric` reward on stage C's adapter ({rl['steps']} steps of 2 training "
                  f"sums x 8 sampled answers): greedy answers right on **{rl['score_before']:.0%} → "
                  f"{rl['score_after']:.0%}** of {rl['held_out_questions']} held-out one-digit sums; mean sampled "
                  f"reward per log {curve}. Greedy answers:", "",
                  "| held-out question | before (after C) | after D |", "|---|---|---|"]
        lines += [f"| {s['prompt']} | {_cell(s['before'])} | {_cell(s['after'])} |" for s in rl["samples"][:5]]
        lines.append("")
    if "lora" in summary:
        b = summary["lora"]
        lines.append(f"Stage B, LoRA on the tiny from-scratch Llama: eval loss {b['eval_loss_before']:.2f} → "
                     f"{b['eval_loss_after']:.2f}, greedy accuracy on {b['eval_questions']} held-out questions "
                     f"{b['accuracy_before']:.0%} → {b['accuracy_after']:.0%}.")
    if "rl" in summary:
        toy = summary["rl"]
        curve = ", ".join(f"{value:.2f}" for _, value in toy["reward"])
        lines.append(f"Stage B2, GRPO with the `numeric` reward on stage B's adapter ({toy['reward'][-1][0]} steps of "
                     f"8 training questions x 8 sampled answers): mean reward {toy['reward_first']:.2f} → "
                     f"{toy['reward_last']:.2f} (per log: {curve}), held-out greedy accuracy "
                     f"{toy['accuracy_before']:.0%} → {toy['accuracy_after']:.0%}.")
    stages = ", ".join(f"{k} {v:.0f} s" for k, v in t.items() if k != "total")
    cpu = summary.get("cpu_s") or {}
    cpu_text = (f", {sum(cpu.values()):.0f} CPU seconds in all (" + ", ".join(f"{k} {v:.0f} s" for k, v in cpu.items())
                + ")") if cpu else ""
    lines.append(f"`make demo` took {t['total']:.0f} s wall after install ({stages}){cpu_text} on "
                 f"{summary.get('machine', 'an unrecorded machine')}; measured {summary.get('date', 'undated')}.")
    lines += ["", EVERY_MACHINE]
    return "\n".join(lines)


# What the tests assert on every machine (tests/e2e/test_demo.py, tests/e2e/test_real_model.py): the digits above are
# one machine's; CPU kernels (AVX2, AVX-512, AMX) round differently, so another machine prints other digits.
EVERY_MACHINE = ("The figures above are one machine's run: the runs are deterministic on a machine, but CPUs with other "
                 "kernels (AVX2, AVX-512, AMX) round differently and print other digits. What holds on every machine, "
                 "and the tests assert: stage C answers 0% of the held-out questions in the house format before and "
                 "at least 90% after; stage D raises the held-out sums answered right by at least 15 points. The toy "
                 "stages (`--no-real`): stage B's eval loss falls by at least 30% and its held-out accuracy rises by "
                 "at least 30 points from at most 10%; stage B2's sampled reward stays within 0.15 of where it starts "
                 "(RL barely moves that tiny from-scratch model, and docs/rl.md measures why).")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def block(page_text: str) -> str | None:
    match = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), page_text, re.S)
    return match.group(1) if match else None


def rewrite(page: Path, summary: dict) -> None:
    text = page.read_text()
    if block(text) is None:
        raise SystemExit(f"{page} has no {BEGIN} ... {END} block")
    new = re.sub(re.escape(BEGIN) + r"\n.*?\n" + re.escape(END),
                 lambda _: f"{BEGIN}\n{markdown(summary)}\n{END}", text, flags=re.S)
    page.write_text(new)


def main(argv: list[str]) -> int:
    if argv:
        shutil.copyfile(argv[0], SUMMARY)
    summary = json.loads(SUMMARY.read_text())
    for page in PAGES:
        rewrite(page, summary)
        print(f"updated {page.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
