"""`eval:` evaluation during training: eval loss, scored generations, lm-eval benchmarks."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ftune.recipe.schema.base import Section


class GenerateEval(Section):
    max_new_tokens: int = Field(64, gt=0)
    """Longest greedy completion per eval row."""
    metrics: list[Literal["exact_match", "f1"]] | None = Field(None, min_length=1)
    """`exact_match` (the whole completion equals the reference, case and spacing aside) and `f1` (word overlap).
    Unset: both for instruction data (short, closed answers), `f1` alone for chat data (free-form answers rarely
    match a reference exactly)."""
    max_samples: int | None = Field(200, gt=0)
    """Eval rows to generate for (null: all)."""


class BenchmarksEval(Section):
    """Standard benchmarks through EleutherAI's lm-eval harness (`pip install "ftune[eval]"`), run on the model in
    memory (adapters active, no merge) and offline: local task YAMLs come from `include` folders (docs/evaluation.md)."""

    tasks: list[str] = Field(min_length=1)
    """lm-eval task or group names: the installed harness's (e.g. arc_easy) or those the `include` folders define."""
    include: list[str] = []
    """Folders of local lm-eval task YAMLs (their `task:` names join the harness's); relative to the recipe file."""
    num_fewshot: int | None = Field(None, ge=0)
    """Few-shot examples per prompt; unset: each task's own default."""
    limit: int | None = Field(None, gt=0)
    """Rows evaluated per task (the first N); unset: every row."""
    at: list[Literal["start", "end", "steps"]] = Field(default_factory=lambda: ["start", "end"], min_length=1)
    """When `ftune run` measures: `start` (the base model, before step 1), `end` (after the last step) and `steps`
    (at each eval of eval.strategy). Results go to metrics.jsonl as `bench/<task>/<metric>` and to summary.json."""


class EvalSection(Section):
    strategy: Literal["no", "steps", "epoch"] = "no"
    """When to evaluate."""
    steps: int | None = Field(None, gt=0)
    """Evaluate every N steps (strategy: steps)."""
    batch_size: int | None = Field(None, gt=0)
    """Eval batch size per device; default: train.per_device_batch_size."""
    on_start: bool = False
    """Also evaluate before the first step, so metrics.jsonl holds the starting eval loss."""
    generate: GenerateEval | None = None
    """Evaluation by generation: greedy completions of the eval prompts scored against the reference answers
    (instruction and chat data), reported by `ftune eval` and at the end of `ftune run` (into metrics.jsonl)."""
    per_epoch: int | None = Field(None, ge=1)
    """Evaluate N times per epoch, evenly (instead of `strategy`/`steps`; needs `train.epochs`)."""
    benchmarks: BenchmarksEval | None = None
    """lm-eval harness benchmarks on the live model at the start, the end and/or each eval step of a run, and by
    `ftune eval --benchmarks` on a finished one."""
