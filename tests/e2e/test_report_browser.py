"""`ftune report`'s page drawn in a real browser (headless Chromium, Debian's `chromium`; .ci/run installs it):
for a finished run, a stopped run, an RL run and a two-run comparison (tests/data/report_runs, recorded from
small real runs), the charts drew every point (the page writes what it drew into its DOM, read with --dump-dom),
the screenshot is not blank (the first curve's colour is on it), no script error or console.error happened (a
hook in the page writes them into the DOM), and every number of summary.json is on the page, equal.

The screenshots are kept as test artifacts under .artifacts/report-browser/ (git-ignored)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

RUNS = Path(__file__).resolve().parents[1] / "data" / "report_runs"
ARTIFACTS = Path(__file__).resolve().parents[2] / ".artifacts" / "report-browser"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install -y chromium; .ci/run "
                                                          "installs it)")]

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1280,1800", "--hide-scrollbars"]
PAGES = {"finished": ["finished"], "stopped": ["stopped"], "rl": ["rl"], "compare": ["finished", "second"]}
FIRST_LINE = (0x2F, 0x6F, 0xDB)
"""page.js's first line colour (#2f6fdb): on the screenshot only where a curve was drawn."""


class Dom(HTMLParser):
    """The dumped DOM's body attributes, the charts' drawn/expected counts, the metric cells and #js-errors."""

    def __init__(self) -> None:
        super().__init__()
        self.body: dict = {}
        self.charts: list[dict] = []
        self.cells: list[dict] = []
        self.errors = ""
        self._cell: dict | None = None
        self._in_errors = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        elif "data-chart" in a:
            self.charts.append(a)
        elif tag == "td" and "data-key" in a:
            self._cell = {**a, "text": ""}
        elif a.get("id") == "js-errors":
            self._in_errors = True

    def handle_data(self, data):
        if self._cell is not None:
            self._cell["text"] += data
        if self._in_errors:
            self.errors += data

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.cells.append(self._cell)
            self._cell = None
        if tag == "pre":
            self._in_errors = False


def first_line_pixels(png: Path) -> int:
    import numpy as np
    from PIL import Image

    with Image.open(png) as img:
        return int((np.asarray(img.convert("RGB")) == FIRST_LINE).all(axis=-1).sum())


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict:
    """Each page written by `ftune report`, then drawn by Chromium (all at once: a browser start is mostly
    waiting): name -> (page, dumped DOM, screenshot)."""
    from ftune.cli.main import main

    folder = tmp_path_factory.mktemp("report-browser")
    pages = {}
    for name, runs in PAGES.items():
        out = folder / f"{name}.html"
        assert main(["report", *[str(RUNS / r) for r in runs], "--out", str(out)]) == 0
        pages[name] = out
    # a page whose script meets a chart with no element: the error hook must show it (the check is not blind)
    broken = folder / "broken.html"
    broken.write_text(pages["finished"].read_text().replace('data-chart="lr"', 'data-chart="lost"', 1))
    pages["broken"] = broken
    procs = {}
    for name, page in pages.items():
        shot = folder / f"{name}.png"
        procs[name] = (subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={folder / ('profile-' + name)}", f"--screenshot={shot}",
             "--dump-dom", page.as_uri()], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), shot)
    out = {}
    for name, (proc, shot) in procs.items():
        dom, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and shot.is_file(), err
        parsed = Dom()
        parsed.feed(dom)
        out[name] = (pages[name], parsed, shot)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for name, (_, _, shot) in out.items():
        shutil.copy(shot, ARTIFACTS / shot.name)
    return out


@pytest.mark.parametrize("name", list(PAGES))
def test_the_page_draws_every_point_with_no_error_and_the_summary_numbers(rendered, name):
    page, dom, shot = rendered[name]
    assert not re.search(r"(https?:|src=|href=|@import|url\()", page.read_text(), re.I)
    assert dom.body.get("data-ready") == "1" and "data-errors" not in dom.body and dom.errors.strip() == "", dom.errors
    expected = json.loads(re.search(r'id="report-data">(.*?)</script>', page.read_text()).group(1))
    want = {c["id"]: sum(len(line["points"]) for line in c["lines"]) for c in expected["charts"]}
    drawn = {c["data-chart"]: int(c.get("data-drawn", 0)) for c in dom.charts}
    assert drawn == want and all(want.values())
    assert int(dom.body["data-charts"]) == len(want) and int(dom.body["data-points"]) == sum(want.values())
    assert first_line_pixels(shot) > 200  # curves on the screenshot, not a blank or uniform page

    for run in PAGES[name]:
        cells = {c["data-key"]: c for c in dom.cells if c["data-run"] == run}
        for key, value in finals(run).items():
            assert float(cells[key]["data-value"]) == value, key
            shown = float(cells[key]["text"].replace(",", ""))  # six significant digits on the page
            assert shown == pytest.approx(value, rel=5e-6, abs=1e-12), key
        assert "loss" in cells or "final_loss" in cells


def finals(run: str) -> dict:
    """summary.json's numbers; for a run without one (stopped), each metric's last value in metrics.jsonl."""
    from ftune.rundir import RunDir, read_metrics

    path = RUNS / run / "summary.json"
    if path.exists():
        return {k: v for k, v in json.loads(path.read_text()).items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)}
    last: dict = {}
    for record in read_metrics(RunDir(RUNS / run)):
        last |= {k: v for k, v in record.items() if k in ("loss", "grad_norm", "learning_rate", "eval_loss")}
    return last


def test_the_error_hook_reports_a_script_error(rendered):
    _, dom, _ = rendered["broken"]
    assert dom.body.get("data-errors") == "1" and "no element for chart lr" in dom.errors
