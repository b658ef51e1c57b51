"""`ftune report`: a run (or several, compared) as one self-contained HTML page.

Light: reads the run dir's text files through `ftune.rundir.RunDir` (no torch), so the command, the worker's live
refresh (`output.report: true`) and the demo write the same page. `collect` reads the facts, `page` writes the HTML
(tables here, charts drawn in the browser by page.js from the data in the page; nothing is fetched).
"""

from __future__ import annotations

from pathlib import Path

from ftune.outputs import write_text_atomic
from ftune.report.collect import RunFacts, charts, labels, read_run
from ftune.report.page import render

__all__ = ["RunFacts", "read_runs", "render_runs", "write_report"]


def read_runs(roots: list[Path | str]) -> list[RunFacts]:
    runs = [read_run(root) for root in roots]
    for run, label in zip(runs, labels([run.root for run in runs])):
        run.label = label
    return runs


def render_runs(roots: list[Path | str]) -> str:
    runs = read_runs(roots)
    return render(runs, charts(runs))


def write_report(roots: list[Path | str], out: Path) -> Path:
    """The page of `roots`, written atomically to `out` (a reader never sees half a page)."""
    write_text_atomic(out, render_runs(roots))
    return out
