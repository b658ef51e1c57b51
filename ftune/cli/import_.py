"""`ftune import axolotl|llama-factory|torchtune FILE [-o OUT]`: a peer's config as an ftune recipe.

Every key with an ftune equivalent is translated; every other key is listed on stderr with its line
and the reason, and as comments at the top of the recipe. The recipe is checked with ftune's own
loader before it is written. Exit codes: 0 written (harmless keys may be left out); 1 the file can't be read or
parsed, the imported recipe doesn't validate, or a key left out changes what is trained ("CHANGES BEHAVIOUR":
the recipe is still written, to be fixed by hand; `--accept-changes` exits 0 for it, so a script can go on).
"""

from __future__ import annotations

import argparse
import shlex
import sys

from ftune.errors import EXIT_INVALID, EXIT_OK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ftune.importers import PEERS

    parser.add_argument("peer", choices=list(PEERS), metavar="PEER", help=f"the config's tool: {', '.join(PEERS)}")
    parser.add_argument("file", metavar="FILE", help="the peer's YAML config")
    parser.add_argument("-o", "--output", metavar="OUT", help="write the recipe here (default: stdout)")
    parser.add_argument("--force", action="store_true", help="replace OUT if it is a recipe `ftune import` wrote")
    parser.add_argument("--accept-changes", action="store_true",
                        help="exit 0 although keys that change what is trained were left out (they stay listed)")


def run(args: argparse.Namespace) -> int:
    from ftune import outputs
    from ftune.cli.console import write_stdout
    from ftune.importers import convert
    from ftune.importers import validate

    out = outputs.check_output(args.output, outputs.RECIPE, inputs=[args.file], force=args.force) \
        if args.output is not None else None  # before anything is read: never the peer config itself
    imported = convert(args.peer, args.file)
    command = shlex.join(["ftune", "import", args.peer, imported.source] + (["-o", args.output] if args.output else []))
    text = imported.yaml(command)
    where = args.output or "<stdout>"
    problems = validate(text, where)
    if out is not None:
        outputs.write_text(out, text)  # atomic: a full disk leaves the old file (or none), never a cut one
    else:
        write_stdout(text)
    for u in sorted(imported.unmapped, key=lambda u: not u.changes):
        what = "CHANGES BEHAVIOUR, not imported" if u.changes else "not imported"
        print(f"{imported.source}:{u.line or 1}: {what}: {u.key}: {u.reason}", file=sys.stderr)
    n = len(imported.unmapped)
    changes = sum(u.changes for u in imported.unmapped)
    summary = f"imported {imported.source} ({args.peer})" + (f" → {args.output}" if args.output else "")
    summary += f": {n} key{'s' if n != 1 else ''} not imported" if n else ": every key imported"
    if changes:
        summary += f" ({changes} of them change{'s' if changes == 1 else ''} what is trained: read them)"
    if imported.notes:
        summary += f", {len(imported.notes)} note{'s' if len(imported.notes) != 1 else ''} to check (comments at the top)"
    print(summary, file=sys.stderr)
    if problems:
        from ftune.cli.console import print_problems

        print("the imported recipe does not validate yet; fix these by hand:", file=sys.stderr)
        print_problems(problems, sys.stderr)
        return EXIT_INVALID
    if changes and not args.accept_changes:
        print(f"exit 1: the recipe trains differently from the {args.peer} config in {changes} way"
              f"{'s' if changes != 1 else ''} listed above (CHANGES BEHAVIOUR); fix them in the recipe, or pass "
              "--accept-changes to accept them", file=sys.stderr)
        return EXIT_INVALID
    return EXIT_OK
