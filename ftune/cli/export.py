"""`ftune export gguf RUN_DIR|MERGED_DIR [--outtype f16|bf16|q8_0] [--out FILE] [--force]`: one GGUF file for
llama.cpp / Ollama / LM Studio, with the tokenizer and chat template, verified and written atomically.

A run dir is merged first, on the fly, into a temporary folder (`ftune.infer.merge`: LoRA folded into an
unquantized base, a QLoRA run too; prefix tuning and LLaMA-Adapter, which have no weights to fold, are refused
there); a merged or model folder is exported as it is (`ftune.gguf.export`). docs/gguf.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from ftune.errors import Location, RunError, UsageError

OUTTYPES = ("f16", "bf16", "q8_0")  # ftune.gguf.export.OUTTYPES, spelled here so --help imports nothing heavy


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("format", choices=["gguf"], help="the file format (gguf)")
    p.add_argument("target", metavar="RUN_DIR_OR_MODEL", help="a run dir (merged on the fly), a merged or model folder")
    p.add_argument("--outtype", choices=OUTTYPES, default="f16", help="weight type of the file (default: f16)")
    p.add_argument("--out", help="output file (default: <run dir>/<name>-<outtype>.gguf, or beside the folder)")
    p.add_argument("--force", action="store_true", help="replace an existing output file")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def default_out(target, outtype: str) -> Path:
    if target.plan is not None and not target.is_merged:
        return target.model_dir.parent / f"{target.plan.recipe.name}-{outtype}.gguf"
    return target.model_dir.parent / f"{target.model_dir.name}-{outtype}.gguf"


def run(args: argparse.Namespace) -> int:
    import importlib.util

    from ftune.gguf import INSTALL_HINT

    if importlib.util.find_spec("gguf") is None:
        raise UsageError("`ftune export gguf` needs the `gguf` package (llama.cpp's GGUF writer), not installed",
                         hint=INSTALL_HINT)
    from ftune.gguf.export import ExportError, export
    from ftune.infer.source import resolve

    say = (lambda s: print(s, file=sys.stderr)) if args.json else print
    target = resolve(args.target, allow_model=True)
    from ftune.outputs import GGUF, check_output

    # the output policy (ftune/outputs.py): never a run's own files, a model folder, the input, or a file ftune
    # did not write; --force replaces only a GGUF `ftune export` wrote
    out = check_output(args.out if args.out else default_out(target, args.outtype), GGUF,
                       inputs=[target.model_dir], force=args.force, flag="--out")
    if not out.parent.is_dir():
        raise UsageError(f"{out.parent} is not a folder", hint="--out names a file in an existing folder")
    scratch = None
    try:
        folder = target.model_dir
        if target.plan is not None and not target.is_merged:
            from ftune.infer.merge import merge

            # in the system temp dir: never inside the run dir, which the output policy keeps to the run's files
            scratch = Path(tempfile.mkdtemp(prefix=f"ftune-export-{out.stem}-"))
            say(f"merging {target.model_dir} first (into a temporary folder, float32)")
            merge(target, out=scratch / "merged", dtype="float32", quantize=False, log=say)
            folder = scratch / "merged"
        elif not (folder / "config.json").is_file():
            raise UsageError(f"{folder} has no config.json", hint="export a run dir, a merged folder or a model folder")
        result = export(folder, out, args.outtype, log=say)
    except ExportError as err:
        raise RunError(f"GGUF export failed, no file written: {err}",
                       hint="see docs/gguf.md for what export supports") from err
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        print(json.dumps(asdict(result), indent=2))
        return 0
    print(f"exported {folder if scratch is None else target.model_dir} -> {result.file}")
    print(f"  verified  max |logit difference| {result.max_diff:.3g} (relative) <= {result.tolerance} ({result.outtype});"
          f" greedy next tokens {'equal' if result.greedy_equal else 'differ at some positions'}")
    print(f"  use it    llama.cpp: llama-cli -m {result.file}   transformers: from_pretrained(dir, gguf_file=...)")
    return 0
