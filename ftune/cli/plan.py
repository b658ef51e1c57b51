"""`ftune plan RECIPE [key=value ...]`: what a recipe will do and cost, before anything is downloaded.

Shows the parameters (peft's own counts) and the modules the method touches, the distributed layout,
memory per device with a fits / does-not-fit verdict and suggestions, data and steps when the data is
local, and the exact launch command. The model is built on the meta device from its config alone
(`ftune.estimate.estimate`); no weights are read and no GPU is needed.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from ftune.cli.imports import block_bitsandbytes
from ftune.errors import EXIT_OK, FtuneError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", metavar="RECIPE", help="recipe file")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="override a key (train.max_steps=5, ...)")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")
    parser.add_argument(
        "--gpu-memory",
        metavar="SIZE",
        help="memory of one GPU to plan for, e.g. 80GiB or 24GB (default: the visible GPU's, else plan for CPU)",
    )
    parser.add_argument(
        "--host-memory",
        metavar="SIZE",
        help="RAM of one machine to plan for, which offloaded activations and states must fit, e.g. 512GiB "
             "(default: this machine's when planning for its own GPU)",
    )
    parser.add_argument(
        "--gpus",
        type=int,
        metavar="N",
        help="GPUs per machine to plan for (default: the visible ones; with --gpu-memory: the recipe's processes)",
    )


from ftune.estimate.data import DataCount, count_data


# ------------------------------------------------------------------------------------------- output
def epochs_text(data: DataCount, max_steps: int | None) -> str:
    """How many passes the total is: train.epochs, or what train.max_steps (which wins over epochs) comes to."""
    epochs = data.epochs
    if max_steps and data.steps_per_epoch:
        return f"train.max_steps: {max_steps / data.steps_per_epoch:.3g} epochs"
    return f"{epochs:g} epoch{'' if epochs == 1 else 's'}"


def summarize_names(names: list[str]) -> list[tuple[str, int]]:
    """`model.layers.0.self_attn.q_proj` x32 -> (`model.layers.*.self_attn.q_proj`, 32), in first-seen order."""
    return list(Counter(re.sub(r"(?<=\.)\d+(?=\.|$)", "*", n) for n in names).items())


def _compile(loaded, gpus: int | None, gpu_memory: int | None = None):
    """The Plan, without the checks that need the inputs on disk (plan shows what is missing instead), and the
    meta model its checks built (the estimate's, so `plan` builds the model once).

    `gpus`: plan for that many GPUs per machine even where none is visible (`--gpu-memory`/`--gpus`), so
    GPU-only settings are not refused as they would be for a run on this CPU machine; `auto` batch sizes are sized
    against `gpu_memory` then.
    """
    from ftune.estimate.autobatch import chooser
    from ftune.plan.compile import compile_with_model

    return compile_with_model(loaded, check_inputs=False, gpus=gpus or None, reads_model=True,
                              choose=chooser(gpu_memory))


def run(args: argparse.Namespace) -> int:
    try:
        return _plan(args)
    except FtuneError as err:
        if args.format != "json":
            raise
        print(json.dumps(errors_json(args.recipe, err), indent=2))
        return err.exit_code


def errors_json(recipe_file: str, err: FtuneError) -> dict:
    """A failed plan as `--format json` prints it: the recipe, and its errors as `validate --format json` has them."""
    from ftune.errors import Location, Problem, RecipeError

    file = str(Path(recipe_file).resolve())
    problems = err.problems if isinstance(err, RecipeError) else [
        Problem(err.message, "", err.hint, err.location or Location(file))]
    fields = ("file", "line", "column", "path", "message", "hint")
    return {"recipe": file, "errors": [{k: v for k, v in p.as_json().items() if k in fields} for p in problems]}


def sequence_length(recipe, data: DataCount | None) -> int | None:
    """The tokens per row the plan sizes activations for when data.max_seq_length is unset: the longest tokenized
    row of the local data (the run truncates nothing then). Unset and unreadable (a hub dataset, a tokenizer not on
    this machine): a RecipeError at data.max_seq_length, since the model's maximum (131,072 tokens for Llama 3.1)
    would plan hundreds of GiB for short rows. An RL objective sizes its rows from its prompt and completion."""
    from ftune.errors import Problem, RecipeError
    from ftune.recipe.objectives import family_of

    if recipe.data.max_seq_length is not None or family_of(recipe).generates:
        return None
    if data is not None and data.longest is not None:
        return data.longest
    why = "a data source is not a local file" if data is None else "the tokenizer is not on this machine"
    raise RecipeError([Problem.at("data.max_seq_length", f"unset, and the plan can't find the longest row ({why}): "
                                  "the model's maximum would size activations for rows far longer than most data",
                                  "set data.max_seq_length to the longest row the run trains on (rows past it are "
                                  "truncated), or run `ftune plan` where the data and tokenizer are")])


def _plan(args: argparse.Namespace) -> int:
    from ftune.errors import RecipeError
    from ftune.estimate.estimate import estimate, parse_bytes
    from ftune.recipe import load_recipe

    gpu_memory = parse_bytes(args.gpu_memory, "--gpu-memory") if args.gpu_memory is not None else None
    host_ram = parse_bytes(args.host_memory, "--host-memory") if args.host_memory is not None else None
    loaded = load_recipe(args.recipe, args.overrides)
    recipe = loaded.recipe
    block_bitsandbytes(recipe)  # planning never quantizes; before the preflight imports peft
    gpus = args.gpus
    if gpus is None and gpu_memory is not None:
        n = recipe.distributed.num_processes
        gpus = n if isinstance(n, int) and recipe.distributed.strategy != "none" else 1
    compiled = _compile(loaded, gpus, gpu_memory)
    plan = compiled.plan
    recipe = plan.recipe  # as it runs: a continued adapter's base and peft section
    device = "cuda" if gpus else plan.device
    from ftune.plan.parallelism import data_parallel
    from ftune.plan.checks.paths import missing_inputs

    data = count_data(recipe, data_parallel(recipe, plan.world_size), plan.tokenizer_path, plan.trainer["num_train_epochs"])
    unsized: list = []  # data.max_seq_length unset and no longest row: refused with the estimate's own problems
    try:
        seq = sequence_length(recipe, data)
    except RecipeError as err:
        seq, unsized = None, err.problems
    try:
        est = estimate(recipe, world_size=plan.world_size, num_processes=plan.num_processes,
                       gpu_memory=gpu_memory, device=device, seq_length=seq, meta=compiled.meta, host_ram=host_ram)
    except RecipeError as err:  # problems at recipe keys: located where the recipe sets them
        raise loaded.error(err.problems + unsized) from None
    if unsized:
        raise loaded.error(unsized)
    from ftune.models.meta import resolve_config
    from ftune.plan.checks.preflight import length_problems

    # the length against the model's positions, as the compiler's preflight checks a local config, for a config
    # from the cache, model.config or the catalog too, and for the data's longest row
    config = json.loads(resolve_config(recipe)[0].read_text())
    if too_long := length_problems(recipe, config, longest=seq):
        raise loaded.error(too_long)
    if seq is not None:
        est.notes.append(f"data.max_seq_length unset: activations for the longest tokenized row, {seq:,} tokens"
                         + (" (≈: counted on a sample or without the prompt template)" if data.approximate else ""))
    missing = missing_inputs(loaded.recipe)  # plan runs without the inputs; it names the ones `run` would refuse
    if args.format == "json":
        out = {
            "recipe": loaded.file,
            "estimate": est.as_json(),
            "data": asdict(data) if data else None,
            "effective_batch_size": plan.effective_batch_size,
            "launch": {"command": plan.launch.command, "env": plan.launch.env},
            "model_load": plan.model_load.model_dump(mode="json"),
            "collator": plan.collator,
            "trainer": plan.trainer,
            "notes": plan.notes + est.notes,
            "missing": [{"path": p.path, "message": p.message, "hint": p.hint} for p in missing],
        }
        print(json.dumps(out, indent=2))
        return EXIT_OK
    render(loaded.file, plan, est, data, missing)
    return EXIT_OK


def flops(n: int) -> str:
    """FLOPs with the unit that fits: 1.2 GFLOP, 3.4 TFLOP, ..."""
    for unit, size in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:,} FLOP"


def render(file: str, plan, est, data: DataCount | None, missing: list | None = None) -> None:
    """The plan as rich text: parameters, layout, memory table and verdict, data and steps, launch."""
    from rich.console import Console
    from rich.table import Table

    from ftune.estimate.estimate import fmt_bytes

    console = Console(highlight=False, soft_wrap=True)
    recipe = plan.recipe
    console.print(f"[bold]ftune plan[/] {file}")
    console.print(f"[bold]model[/]        {est.model} ({est.config_source}) · {est.dtype} · {recipe.model.task}")
    console.print(f"[bold]parameters[/]   {est.params_total:,} total · {est.params_trainable:,} trainable "
                  f"({est.trainable_percent:.4f}%)")
    if est.moe is not None:
        m = est.moe
        console.print(f"[bold]experts[/]      {m.num_experts} per layer, {m.top_k or m.num_experts} per token, "
                      f"{m.moe_layers} MoE layers · {m.params_model:,} in the model, {m.params_experts:,} of them "
                      f"in experts · {m.params_active:,} active per token "
                      f"({100 * m.params_active / m.params_model:.1f}%) · {m.flops_per_token:,} training FLOPs "
                      "per token (6 x active weights)")
        per_expert = m.trainable_by_part.get("experts", 0) // (m.num_experts * m.moe_layers)
        parts = " · ".join(f"{part} {n:,}" + (f" ({per_expert:,} per expert per layer)" if part == "experts" else "")
                           for part, n in sorted(m.trainable_by_part.items()))
        console.print(f"[bold]trains[/]       {parts or 'nothing'}")
    if est.vision is not None:
        for line in vision_lines(est.vision):
            console.print(line)
    if (t := est.teacher) is not None:
        console.print(f"[bold]teacher[/]      {t.path} · {t.params:,} parameters frozen in {t.dtype} "
                      f"({fmt_bytes(t.weight_bytes)}, no gradients or optimizer state) · forward "
                      f"{flops(t.forward_flops_per_step)} per step beside the student's "
                      f"{flops(t.student_flops_per_step)} (train, 6 x) · {t.tokens_per_step:,} tokens per step")
    groups = summarize_names(est.matched_modules)
    shown = ", ".join(f"{name} x{n}" if n > 1 else name for name, n in groups[:8])
    more = f", ... ({len(groups) - 8} more)" if len(groups) > 8 else ""
    console.print(f"[bold]method[/]       {recipe.peft.method}: {len(est.matched_modules)} matched: {shown}{more}")
    dist = recipe.distributed
    layout = f"{dist.strategy}, {plan.world_size} process(es) on {dist.num_machines} machine(s), {est.device}"
    if est.fsdp is not None:
        classes = ", ".join(f"{c} x{n}" for c, n in est.fsdp.unit_classes.items())
        from ftune.recipe.schema import FsdpSection

        sharding = (dist.fsdp or FsdpSection()).sharding_strategy  # no section: its defaults run
        layout += (f"\n             FSDP {sharding}: {est.fsdp.units} units ({classes}); "
                   f"shard {fmt_bytes(est.fsdp.shard_bytes_per_rank)} per rank over {est.fsdp.shard_ranks} ranks")
    if (par := plan.parallelism) is not None and par.total > 1:
        layout += (f"\n             dp_replicate {par.dp_replicate} x dp_shard {par.dp_shard} x tp {par.tp} x cp {par.cp}:"
                   f" {par.dp} data-parallel rank(s)")
    console.print(f"[bold]distributed[/]  {layout}")

    table = Table(title="memory per device (peak)", title_justify="left", show_edge=False)
    table.add_column("kind")
    table.add_column("detail")
    table.add_column("bytes", justify="right")
    table.add_column("at peak", justify="center")
    for item in est.memory:
        peak = item.phase in ("always", est.peak_phase)
        table.add_row(item.kind, item.detail, fmt_bytes(item.bytes), "yes" if peak else f"no ({item.phase})")
    table.add_row("[bold]total[/]", f"peak during {est.peak_phase}", f"[bold]{fmt_bytes(est.total_bytes)}[/]", "")
    console.print(table)
    if est.offloaded_bytes:
        console.print(f"offloaded to host memory: {fmt_bytes(est.offloaded_bytes)}")
    if est.device_memory is None:
        console.print("[bold]verdict[/]      unknown: no device memory known (pass --gpu-memory 80GiB)")
    else:
        word = "[green]fits[/]" if est.fits else "[red bold]does not fit[/]"
        console.print(f"[bold]verdict[/]      {word}: {fmt_bytes(est.total_bytes)} of "
                      f"{fmt_bytes(est.device_memory)} ({100 * est.total_bytes / est.device_memory:.0f}%)")
    if est.generation is not None:
        console.print(f"[bold]generation[/]   KV cache {fmt_bytes(est.generation.bytes)} per process "
                      f"({est.generation.backend}): {est.generation.detail}")
    if est.fp8 is not None:
        from ftune.estimate.fp8 import describe

        console.print(f"[bold]precision[/]    {describe(est.fp8)}")
    if est.longest_seq is not None:
        console.print(f"[bold]longest row[/]  {est.longest_seq:,} tokens fit (per_device_batch_size "
                      f"{plan.recipe.train.per_device_batch_size}; activations grow linearly with the row)")
    console.print("[bold]largest[/]      " + "; ".join(est.largest))
    for s in est.suggestions:
        console.print(f"  suggestion: {s}")
    missing = missing or []
    if data is None:
        reason = next((p.message for p in missing if p.path.startswith("data.")), "a source is not a local file")
        console.print(f"[bold]data[/]         not counted ({reason})")
    else:
        approx = "≈" if data.approximate else ""
        tokens = f"{approx}{data.tokens:,} tokens" if data.tokens is not None else "tokens: tokenizer not local"
        packed = f" · {approx}{data.rows:,} packed rows" if data.rows not in (None, data.samples) else ""
        console.print(f"[bold]data[/]         {data.samples:,} samples · {tokens}{packed}")
        if data.steps_per_epoch is None:
            fixed = f"{data.total_steps:,} total (train.max_steps); " if data.total_steps else ""
            console.print(f"[bold]steps[/]        {fixed}per epoch unknown: packing needs token counts "
                          "(the tokenizer is not local)")
        else:
            console.print(f"[bold]steps[/]        {data.steps_per_epoch:,} per epoch · {data.total_steps:,} total "
                          f"({epochs_text(data, plan.recipe.train.max_steps)}) · effective batch "
                          f"{data.effective_batch}")
    if plan.collator != "padding":
        console.print(f"[bold]packing[/]      samples kept apart by {plan.collator}"
                      + (" (one row per micro-batch, no pad tokens)" if plan.collator == "padding_free" else ""))
    if plan.cpu_threads is not None:
        console.print(f"[bold]threads[/]      {plan.cpu_threads.describe()}")
    import shlex

    console.print("[bold]launch[/]       ", end="")
    console.print(shlex.join(plan.launch.command), markup=False)
    for note in plan.notes + est.notes:
        console.print(f"  note: {note}")
    for p in missing:  # the compiler's words (`ftune.plan.checks.paths`), as `run` and `validate --check-paths` say them
        console.print(f"  missing: {p.path}: {p.message} (`ftune run` refuses it)", markup=False)


def vision_lines(v) -> list[str]:
    """A vision-language model's parts (parameters, trainable) and what one image costs."""
    from ftune.estimate.estimate import fmt_bytes

    parts = " · ".join(f"{part} {c.params:,}{' ' + c.mode if c.mode else ''} ({c.trainable:,} trainable)"
                       for part, c in v.parts.items())
    lines = [f"[bold]parts[/]        {parts}"]
    if v.image is not None:
        lines.append(f"[bold]images[/]       {v.image.tokens:,} tokens, {v.image.patches:,} encoder patches per image "
                     f"({v.image.how}) · image encoder activations {fmt_bytes(v.encoder_activation_bytes)} per device")
    return lines

