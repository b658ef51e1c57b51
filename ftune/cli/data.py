"""`ftune data RECIPE [key=value ...]`: the training data as the model will see it, before any GPU hour.

Loads the tokenizer only (never model weights), runs the data stage (through its cache, so a later
`ftune run` starts from the same entry), and shows rendered samples with trained and masked tokens
in two colours, a histogram of token lengths, truncation and drop counts, and the packing fill.
"""

from __future__ import annotations

import argparse
import json
import sys

from ftune.errors import EXIT_OK, FtuneError

TRAINED, MASKED = "bold green", "dim"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", metavar="RECIPE", help="recipe file")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="override a key, as for `ftune run`")
    parser.add_argument("--n", type=int, default=3, help="samples to show (default: 3)")
    parser.add_argument("--split", choices=("train", "eval"), default="train", help="which data to show")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")




def source_rows(report, split: str) -> list[str] | None:
    """Each sample's source as `data.train[0] row 121 of data.jsonl` (the file's 1-based row, as data errors name
    it), from the cache entry; None where the entry keeps none (packed rows, streamed data)."""
    from ftune.datastage.pipeline import origins

    found = origins(report.cache_path, split) if report.cache_path else None
    if found is None:
        return None
    return [f"{report.sources[k].where} row {row + 1} of {report.sources[k].path}" for k, row in found]


def samples(ds, n: int, task: str, sources: list[str] | None = None) -> list[dict]:
    """The first `n` samples of `ds`; packed rows are split back into their samples (position restarts).
    `sources`: each row's source file and row (`source_rows`)."""
    out: list[dict] = []
    rows = enumerate(ds) if not hasattr(ds, "__len__") else ((r, ds[r]) for r in range(len(ds)))  # a stream: in order
    for r, row in rows:
        origin = {"source": sources[r]} if sources is not None else {}
        if task == "sequence-classification":
            out.append({"row": r, **origin, "input_ids": row["input_ids"], "label": row["labels"]})
        else:
            pos = row.get("position_ids") or list(range(len(row["input_ids"])))
            starts = [i for i, p in enumerate(pos) if p == 0] + [len(pos)]
            for k, (s, e) in enumerate(zip(starts, starts[1:])):
                trained = [i > s and lab != -100 for i, lab in enumerate(row["labels"][s:e], start=s)]
                out.append({"row": r, **origin, "segment": k if len(starts) > 2 else None,
                            "input_ids": row["input_ids"][s:e], "trained": trained,
                            **({"images": row["images"]} if "images" in row else {})})
                if len(out) >= n:
                    return out
        if len(out) >= n:
            break
    return out[:n]


def preference_samples(tok, ds, n: int, sources: list[str] | None = None) -> list[dict]:
    """Preference rows as the trainer scores them: the prompt masked, then each completion (chosen and rejected,
    or the unpaired completion with its label) trained."""
    out: list[dict] = []
    for r in range(min(n, len(ds))):
        row = ds[r]
        origin = {"source": sources[r]} if sources is not None else {}
        names = ["chosen", "rejected"] if "chosen" in row else ["completion"]
        for k, name in enumerate(names):
            prompt = tok(row["prompt"], add_special_tokens=False)["input_ids"]
            comp = tok(row[name], add_special_tokens=False)["input_ids"]
            kind = name if name != "completion" else ("desirable" if row["label"] else "undesirable")
            out.append({"row": r, **origin, "completion": kind, "input_ids": prompt + comp,
                        "runs": [{"text": row["prompt"], "trained": False, "tokens": len(prompt)},
                                 {"text": row[name], "trained": True, "tokens": len(comp)}],
                        **({"images": row["images"]} if "images" in row else {})})
    return out


def prompt_samples(tok, ds, n: int, render=None) -> list[dict]:
    """Online RL rows as generation starts from them: the rendered prompt (nothing trained: the completions are
    generated during training) and the reference answer the rewards read. `render`: a vision-prompt row's JSON
    messages -> the text the processor's template makes of them (one placeholder per image)."""
    out: list[dict] = []
    for r in range(min(n, len(ds))):
        row = ds[r]
        text = render(row["prompt"]) if render is not None else row["prompt"]
        ids = tok(text, add_special_tokens=False)["input_ids"]
        out.append({"row": r, "input_ids": ids, "answer": row.get("answer"), "source": row.get("_row"),
                    "runs": [{"text": text, "trained": False, "tokens": len(ids)}],
                    **({"images": row["images"]} if "images" in row else {})})
    return out


def runs(tok, sample: dict) -> list[dict]:
    """The sample as consecutive runs of trained / masked tokens, each decoded to text."""
    ids, flags = sample["input_ids"], sample.get("trained") or [False] * len(sample["input_ids"])
    out: list[dict] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or flags[i] != flags[start]:
            out.append({"text": tok.decode(ids[start:i]), "trained": bool(flags[start]), "tokens": i - start})
            start = i
    return out


def histogram_lines(report, width: int = 40) -> list[str]:
    if not report.histogram:
        return []
    top = max(c for _, _, c in report.histogram) or 1
    lines = []
    for lo, hi, count in report.histogram:
        limit = report.max_seq_length
        cut = "" if not limit or hi - 1 <= limit else " (truncated)" if lo > limit else " (partly truncated)"
        bar = "█" * round(width * count / top)
        lines.append(f"  {lo:>6}-{hi - 1:<6} {bar:<{width}} {count}{cut}")
    return lines


def run(args: argparse.Namespace) -> int:
    from ftune.recipe.load import load_recipe

    from ftune.plan.compile import compile_plan

    loaded = load_recipe(args.recipe, args.overrides)
    n = loaded.recipe.distributed.num_processes
    gpus = n if isinstance(n, int) and loaded.recipe.distributed.strategy != "none" else 1
    # the data decisions (and every pre-launch check) of a run, planned for the recipe's own layout, as
    # `ftune plan --gpus N` does: the data of a GPU recipe can be inspected on a laptop
    plan = compile_plan(loaded, check_inputs=False, gpus=gpus)
    recipe = plan.recipe
    from ftune.launch.gguf import materialize

    for warning in materialize(plan, loaded, log=lambda line: print(line, file=sys.stderr)):  # a GGUF: as `run` does
        print(warning, file=sys.stderr)
    from ftune.quiet import quiet_libraries

    quiet_libraries()  # datasets' map bars: ftune prints its own lines
    from ftune.datastage import tokenizer
    from ftune.datastage import build

    processor = tokenizer.load_processor(plan)  # a vision-language model's: its tokenizer renders the rows
    tok = processor.tokenizer if processor is not None else tokenizer.load(plan.tokenizer_path, recipe,
                                                                          token=loaded.secret("model.hub_token"),
                                                                          prompt=plan.prompt)
    log: list[str] = []
    bundle = build(recipe, tok, plan.data, log=log.append, processor=processor)
    ds = bundle.train if args.split == "train" else bundle.eval
    if ds is None:
        raise FtuneError("the recipe has no eval data", hint="set data.eval (e.g. {split: 0.05}) or drop --split")
    if "_row" in ds.column_names:
        render = None
        if processor is not None:  # vision-prompt rows keep their messages (GRPO renders them)
            from ftune.datastage.vision_chat import template_of

            template = template_of(recipe, processor)
            render = lambda p: processor.apply_chat_template(json.loads(p), chat_template=template,  # noqa: E731
                                                             tokenize=False, add_generation_prompt=True)
        shown = prompt_samples(tok, ds, args.n, render)
    elif "prompt" in ds.column_names:
        shown = preference_samples(tok, ds, args.n, source_rows(bundle.report, args.split))
    else:
        shown = samples(ds, args.n, recipe.model.task, source_rows(bundle.report, args.split))
    for s in shown:
        if "runs" in s:
            continue
        if "label" in s:
            s["text"] = tok.decode(s["input_ids"])
            s["label_name"] = bundle.label_names[s["label"]] if bundle.label_names else None
        else:
            s["runs"] = runs(tok, s)

    if args.format == "json":
        out = {
            "recipe": loaded.file,
            "mechanism": bundle.mechanism,
            "report": bundle.report.as_dict(),
            "warnings": bundle.warnings,
            "samples": [{k: v for k, v in s.items() if k not in ("trained",)} for s in shown],
        }
        json.dump(out, sys.stdout, indent=1)
        print()
        return EXIT_OK
    _print_text(recipe, bundle, shown, args.split)
    return EXIT_OK


def _print_text(recipe, bundle, shown: list[dict], split: str) -> None:
    from rich.console import Console
    from rich.text import Text

    console = Console(highlight=False, soft_wrap=True)
    rep = bundle.report
    # Without a terminal (a pipe, a CI log) colours are dropped, so trained runs are bracketed instead.
    mark = ("", "") if console.is_terminal else ("⟦", "⟧")
    console.print(Text.assemble(("legend: ", "bold"), (f"{mark[0]}trained{mark[1]}", TRAINED), " · ",
                                ("masked (-100)", MASKED)))
    for i, s in enumerate(shown, start=1):
        where = s.get("source") or f"row {s['row']}"
        if s.get("completion") is not None:
            where += f", {s['completion']}"
        if s.get("segment") is not None:
            where += f", sample {s['segment'] + 1} of the packed row"
        if "label" in s:
            console.print(Text(f"\n── {split} sample {i} ({where}) · {len(s['input_ids'])} tokens · "
                               f"label {s['label']} {s['label_name'] or ''}", style="bold"))
            console.print(s["text"])
            continue
        if "answer" in s:
            console.print(Text(f"\n── {split} sample {i} ({s['source'] or where}) · prompt of {len(s['input_ids'])} "
                               "tokens", style="bold"))
            console.print(Text(s["runs"][0]["text"], MASKED))
            console.print(Text.assemble(("answer: ", "bold"), repr(s["answer"]) if s["answer"] is not None
                                        else "(none)"))
            continue
        n_trained = sum(r["tokens"] for r in s["runs"] if r["trained"])
        head = f"\n── {split} sample {i} ({where}) · {len(s['input_ids'])} tokens · {n_trained} trained"
        console.print(Text(head, style="bold"))
        console.print(Text.assemble(*[(f"{mark[0]}{r['text']}{mark[1]}", TRAINED) if r["trained"]
                                      else (r["text"], MASKED) for r in s["runs"]]))
    if not rep.streaming:  # a stream is not counted before training
        console.print(Text("\ntoken lengths (before truncation)", style="bold"))
        for line in histogram_lines(rep):
            console.print(line)
    console.print(Text("\nsummary", style="bold"))
    for source in rep.sources:
        console.print(f"  {source.where}: {source.path} ({source.format}): {source.rows} rows, "
                      f"{source.dropped} dropped, {source.truncated} truncated, {source.used} used")
    for line in rep.lines():
        line = line.removeprefix("data: ")
        console.print("  " + line, style="bold red" if line.startswith("WARNING") else None)
    if rep.packing:
        flat = " (one row per micro-batch, no pad tokens)" if bundle.mechanism == "padding_free" else ""
        console.print(f"  packing: attention kept per sample by {bundle.mechanism}{flat}")
