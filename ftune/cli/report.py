"""`ftune report RUN_DIR [RUN_DIR ...] [--out report.html] [--open]`: a run's report as one self-contained HTML
file (header and status, curves, final metrics, predictions worst first, RL completions, the recipe with each
value's origin, the plan's decisions); several runs are overlaid, with a diff of the recipe keys that differ.
Light: no torch; it reads the run dirs' files only.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ftune.errors import EXIT_OK, UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run dir(s) `ftune run` wrote; several are compared")
    p.add_argument("--out", "-o", metavar="FILE",
                   help="the HTML file to write (default: RUN_DIR/report.html for one run; required for several)")
    p.add_argument("--force", action="store_true", help="replace an existing report `ftune report` wrote")
    p.add_argument("--open", action="store_true", help="open the written file in the default browser")


def run(args: argparse.Namespace) -> int:
    from ftune.outputs import REPORT, check_output, write_text
    from ftune.report import render_runs
    from ftune.rundir import RunDir

    if args.out is None and len(args.runs) > 1:
        raise UsageError(f"{len(args.runs)} runs are compared into one page: name it with --out",
                         hint="e.g. ftune report " + " ".join(args.runs) + " --out compare.html")
    page = render_runs(args.runs)  # every run dir read (and refused) before anything is written
    own = args.out is None
    target = RunDir(Path(args.runs[0]).expanduser()).report if own else Path(args.out)
    # the run's own report.html is refreshed in place (it is the run's file, not a user-named output)
    out = target.resolve() if own else check_output(target, REPORT, inputs=args.runs, force=args.force,
                                                     flag="--out")
    if own and out.exists() and not REPORT.carries_marker(out):
        raise UsageError(f"{out} exists and is not a report `ftune report` wrote; it is left alone",
                         hint="write elsewhere with --out")
    write_text(out, page)
    print(f"report: {out}")
    if args.open:
        import webbrowser

        if not webbrowser.open(out.as_uri()):
            print("ftune: no browser to open it here; open the file above", flush=True)
    return EXIT_OK
