"""final/README.md: a model card that says what this folder is (peft writes an empty template there).

Base model, method, data, steps, the final metrics and the recipe as it ran, so the folder explains itself
when it is copied away from its run dir.
"""

from __future__ import annotations

from pathlib import Path


def model_card(plan, metrics: dict, steps: int, recipe_text: str) -> str:
    r = plan.recipe
    peft = r.peft
    method = peft.method + (f" (r={peft.r}, alpha={peft.alpha:g})" if hasattr(peft, "r") and hasattr(peft, "alpha")
                            else "")
    if r.kbit is not None:
        method += f", {r.kbit.bits}-bit base"
    sources = [f"- `{s.path}` ({s.format}" + (f", at most {s.limit} rows" if s.limit else "") + ")"
               for s in r.data.train]
    t = plan.trainer  # what ran, as the Plan gave it to the trainer
    schedule = f"{steps} optimizer steps" + (f" of at most {t['max_steps']}" if t.get("max_steps", -1) > 0 else
                                             f" ({t['num_train_epochs']:g} epochs)" if t.get("num_train_epochs")
                                             else "")
    lines = [
        f"# {r.name}",
        "",
        f"Fine-tuned with ftune from `{r.model.path}` ({r.model.task}).",
        "",
        "| | |",
        "|---|---|",
        f"| base model | `{r.model.path}` |",
        f"| method | {method} |",
        f"| objective | {r.train.objective} |",
        f"| training | {schedule}, effective batch {plan.effective_batch_size}, lr {t['learning_rate']:g} "
        f"({t['lr_scheduler_type']}), seed {r.train.seed} |",
        f"| precision | {plan.mixed_precision} on {plan.world_size} × {plan.device} |",
        "",
        "## Data",
        "",
        *sources,
        "",
        "## Final metrics",
        "",
    ]
    shown = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not k.endswith(
        ("_runtime", "_per_second", "preparation_time")) and k != "epoch"}
    if shown:
        lines += ["| metric | value |", "|---|---|"]
        lines += [f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in shown.items()]
    else:
        lines.append("No eval data: the recipe sets no `data.eval`.")
    lines += ["", "## Recipe (as it ran)", "", "```yaml", recipe_text.rstrip(), "```", ""]
    return "\n".join(lines)


def write(plan, metrics: dict, steps: int) -> Path:
    """Write final/README.md from the run's resolved recipe file."""
    run = plan.run
    recipe_text = run.recipe.read_text(encoding="utf-8") if run.recipe.is_file() else ""
    path = run.final / "README.md"
    path.write_text(model_card(plan, metrics, steps, recipe_text), encoding="utf-8")
    return path
