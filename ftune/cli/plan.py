"""`ftune plan RECIPE [key=value ...]`: what a recipe will do and cost, before anything is downloaded.

Shows the parameters (peft's own counts) and the modules the method touches, the distributed layout,
memory per device with a fits / does-not-fit verdict and suggestions, data and steps when the data is
local, and the exact launch command. The model is built on the meta device from its config alone
(`ftune.estimate.estimate`); no weights are read and no GPU is needed.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

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
        "--gpus",
        type=int,
        metavar="N",
        help="GPUs per machine to plan for (default: the visible ones; with --gpu-memory: the recipe's processes)",
    )


# ------------------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class DataCount:
    samples: int
    """Training rows after limits and the eval split."""
    tokens: int | None
    """Tokens of those rows after truncation (None when the tokenizer is not local)."""
    rows: int | None
    """Rows the trainer iterates: samples, or packed sequences with packing (None: tokenizer not local)."""
    steps_per_epoch: int | None
    """None when packing and the tokenizer is not local (packed rows need token counts)."""
    total_steps: int | None
    """train.max_steps, else epochs x steps_per_epoch; None when neither is known."""
    epochs: float
    effective_batch: int
    approximate: bool
    """Tokens counted on a sample of rows, or packed rows derived from token counts."""


MAX_TOKENIZED_ROWS = 20_000


def _rows(path: Path, kind: str) -> list | int | None:
    """The rows of a local file (a list, for token counting), or their count when only that is cheap."""
    suffix = path.suffix.lower()
    if kind == "json" or suffix in (".jsonl", ".json"):
        text = path.read_text(encoding="utf-8")
        if suffix == ".json" and text.lstrip().startswith("["):
            return json.loads(text)
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if kind == "csv" or suffix == ".csv":
        import csv

        with path.open(newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    if kind == "text" or suffix == ".txt":
        return [{"text": line} for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if kind == "parquet" or suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    return None


def _row_text(row: dict, source) -> str:
    f = source.fields
    if source.format == "instruction":
        return " ".join(str(row.get(k) or "") for k in (f.instruction, f.input, f.output))
    if source.format == "chat":
        messages = row.get(f.messages) or []
        return " ".join(str(m.get(f.content, "")) for m in messages if isinstance(m, dict))
    return str(row.get(f.text, ""))


def _tokenizer(path: str):
    file = Path(path).expanduser() / "tokenizer.json"
    if not file.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(file))


def count_data(recipe, world_size: int, tokenizer_path: str, epochs: float) -> DataCount | None:
    """A cheap count of the local training data: rows, tokens (when the tokenizer is local), and steps.

    Instruction and chat rows are counted without their template or chat format, so tokens are a
    slight under-count there. None when a source is not a local file.
    """
    data, train = recipe.data, recipe.train
    samples, tokens, approximate = 0, 0, False
    tok = _tokenizer(tokenizer_path)
    for source in data.train:
        path = Path(source.path).expanduser()
        if source.type in ("hub", "disk") or not path.is_file():
            return None
        rows = _rows(path, source.type)
        if rows is None:
            return None
        n = rows if isinstance(rows, int) else len(rows)
        n = min(n, source.limit) if source.limit else n
        samples += n
        if tok is None or isinstance(rows, int):
            tok = None
            continue
        subset = rows[: min(n, MAX_TOKENIZED_ROWS)]
        lengths = [len(e.ids) for e in tok.encode_batch([_row_text(r, source) for r in subset])]
        if data.max_seq_length and not data.packing:
            lengths = [min(x, data.max_seq_length) for x in lengths]
        tokens += round(sum(lengths) * n / max(len(subset), 1))
        approximate |= len(subset) < n or source.format in ("instruction", "chat")
    if data.eval is not None and not isinstance(data.eval, list):
        held_out = math.ceil(samples * data.eval.split)
        tokens = round(tokens * (samples - held_out) / samples) if samples else 0
        samples -= held_out
    ga = train.gradient_accumulation_steps
    rows_iterated: int | None = samples
    if data.packing and data.max_seq_length:
        rows_iterated = math.ceil(tokens / data.max_seq_length) if tok is not None else None
        approximate = True
    steps_per_epoch, total = None, train.max_steps
    if rows_iterated is not None:
        per_rank = math.ceil(rows_iterated / world_size)  # the distributed sampler pads to equal shards
        batches = math.ceil(per_rank / train.per_device_batch_size)
        steps_per_epoch = max(batches // ga + int(batches % ga > 0), 1)  # as transformers' Trainer counts
        total = train.max_steps or math.ceil(epochs * steps_per_epoch)
    return DataCount(samples, tokens if tok is not None else None, rows_iterated, steps_per_epoch, total, epochs,
                     train.per_device_batch_size * ga * world_size, approximate)


# ------------------------------------------------------------------------------------------- output
def summarize_names(names: list[str]) -> list[tuple[str, int]]:
    """`model.layers.0.self_attn.q_proj` x32 -> (`model.layers.*.self_attn.q_proj`, 32), in first-seen order."""
    return list(Counter(re.sub(r"(?<=\.)\d+(?=\.|$)", "*", n) for n in names).items())


def _block_unneeded_imports() -> None:
    """Planning never quantizes: keep peft/transformers from importing bitsandbytes (seconds of start-up).

    Only in the `ftune` process itself, before peft is imported: peft decides once, at import, whether
    bitsandbytes exists, so doing this in a process that trains later (a test session) would break it.
    """
    own_process = sys.argv[0].endswith(("/ftune", "ftune/cli/main.py"))
    if own_process and "peft" not in sys.modules:
        sys.modules.setdefault("bitsandbytes", None)  # type: ignore[arg-type]


def _compile(loaded, gpus: int | None):
    """The Plan, without the checks that need the inputs on disk (plan shows what is missing instead).

    `gpus`: plan for that many GPUs per machine even where none is visible (`--gpu-memory`/`--gpus`), so
    GPU-only settings are not refused as they would be for a run on this CPU machine.
    """
    from ftune.plan.compile import compile_plan

    return compile_plan(loaded, check_inputs=False, gpus=gpus or None)


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


def _plan(args: argparse.Namespace) -> int:
    from ftune.errors import RecipeError
    from ftune.estimate.estimate import estimate, parse_bytes
    from ftune.recipe import load_recipe

    gpu_memory = parse_bytes(args.gpu_memory, "--gpu-memory") if args.gpu_memory is not None else None
    loaded = load_recipe(args.recipe, args.overrides)
    recipe = loaded.recipe
    gpus = args.gpus
    if gpus is None and gpu_memory is not None:
        n = recipe.distributed.num_processes
        gpus = n if isinstance(n, int) and recipe.distributed.strategy != "none" else 1
    plan = _compile(loaded, gpus)
    recipe = plan.recipe  # as it runs: a continued adapter's base and peft section
    _block_unneeded_imports()
    device = "cuda" if gpus else plan.device
    try:
        est = estimate(recipe, world_size=plan.world_size, num_processes=plan.num_processes,
                       gpu_memory=gpu_memory, device=device)
    except RecipeError as err:  # problems at recipe keys: located where the recipe sets them
        raise loaded.error(err.problems) from None
    data = count_data(recipe, plan.world_size, plan.tokenizer_path, plan.trainer["num_train_epochs"])
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
        }
        print(json.dumps(out, indent=2))
        return EXIT_OK
    render(loaded.file, plan, est, data)
    return EXIT_OK


def render(file: str, plan, est, data: DataCount | None) -> None:
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
    groups = summarize_names(est.matched_modules)
    shown = ", ".join(f"{name} x{n}" if n > 1 else name for name, n in groups[:8])
    more = f", ... ({len(groups) - 8} more)" if len(groups) > 8 else ""
    console.print(f"[bold]method[/]       {recipe.peft.method}: {len(est.matched_modules)} matched: {shown}{more}")
    dist = recipe.distributed
    layout = f"{dist.strategy}, {plan.world_size} process(es) on {dist.num_machines} machine(s), {est.device}"
    if est.fsdp is not None:
        classes = ", ".join(f"{c} x{n}" for c, n in est.fsdp.unit_classes.items())
        layout += (f"\n             FSDP {dist.fsdp.sharding_strategy}: {est.fsdp.units} units ({classes}); "
                   f"shard {fmt_bytes(est.fsdp.shard_bytes_per_rank)} per rank over {est.fsdp.shard_ranks} ranks")
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
    console.print("[bold]largest[/]      " + "; ".join(est.largest))
    for s in est.suggestions:
        console.print(f"  suggestion: {s}")
    if data is None:
        console.print("[bold]data[/]         not counted (a source is not a local file)")
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
            total = f"{data.total_steps:,} total"
            console.print(f"[bold]steps[/]        {data.steps_per_epoch:,} per epoch · {total} "
                          f"({data.epochs:g} epochs) · effective batch {data.effective_batch}")
    if plan.collator != "padding":
        console.print(f"[bold]packing[/]      samples kept apart by {plan.collator}"
                      + (" (one row per micro-batch, no pad tokens)" if plan.collator == "padding_free" else ""))
    import shlex

    console.print("[bold]launch[/]       ", end="")
    console.print(shlex.join(plan.launch.command), markup=False)
    for note in plan.notes + est.notes:
        console.print(f"  note: {note}")
