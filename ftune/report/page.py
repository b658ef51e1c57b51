"""The report as one self-contained HTML page: tables written here, charts drawn in the browser by page.js (inline
SVG) from the data embedded in the page. Nothing is fetched: no URL, no CDN, no font or image from elsewhere.

What the page writes into its own DOM once drawn, for a reader and for the browser test: `body[data-ready]`,
`body[data-charts]` (charts drawn), `body[data-points]` (points drawn), each chart's `data-drawn`, and
`#js-errors` / `body[data-errors]` (every script error and console.error, hooked before any script runs).
"""

from __future__ import annotations

import html
import json
import math
from importlib import resources

from ftune import __version__
from ftune.report.collect import Chart, RunFacts, recipe_diff

GENERATOR = "ftune report"
"""The marker an existing report carries (`ftune report --force` replaces only a file holding it)."""


def _asset(name: str) -> str:
    return resources.files("ftune.report").joinpath(name).read_text(encoding="utf-8")


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def fmt(value: object) -> str:
    """A number as the page shows it: integers in full, others to 6 significant digits."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "" if value is None else str(value)
    if isinstance(value, int) or (math.isfinite(value) and value == int(value) and abs(value) < 1e15):
        return f"{int(value):,}"
    return f"{value:.6g}"


def _script_json(data: object) -> str:
    """JSON safe inside a <script> element: no `</script`, no `<!--`."""
    return json.dumps(data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


def _table(rows: list[tuple[str, str]], cls: str, attrs: str = "") -> str:
    body = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
    return f'<table class="{cls}"{attrs}>{body}</table>'


def _metrics_table(runs: list[RunFacts]) -> str:
    """summary.json of each run, key by key (else its last logged values); the browser test reads each cell's
    `data-value` and text."""
    finals = [run.final_metrics() for run in runs]
    keys: list[str] = []
    for values, _ in finals:
        keys += [k for k, v in values.items() if k not in keys and isinstance(v, (int, float))
                 and not isinstance(v, bool)]
    if not keys:
        return '<p class="empty">no metrics logged yet</p>'
    head = "".join(f"<th>{esc(run.label)}<br><span class=\"note\">{esc(source)}</span></th>"
                   for run, (_, source) in zip(runs, finals))
    rows = []
    for k in keys:
        cells = []
        for run, (values, _) in zip(runs, finals):
            v = values.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                cells.append(f'<td class="num" data-run="{esc(run.label)}" data-key="{esc(k)}" '
                             f'data-value="{esc(repr(v))}">{esc(fmt(v))}</td>')
            else:
                cells.append("<td></td>")
        rows.append(f"<tr><th>{esc(k)}</th>{''.join(cells)}</tr>")
    return f'<table class="metrics" id="final-metrics"><tr><th>metric</th>{head}</tr>{"".join(rows)}</table>'


def _text(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "content" in value:  # a chat message
        return str(value["content"])
    if isinstance(value, list):
        return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" if isinstance(m, dict) else str(m)
                         for m in value)
    return json.dumps(value)


def _predictions(run: RunFacts) -> str:
    if not run.predictions:
        return ""
    score_keys: list[str] = []
    for row in run.predictions:
        score_keys += [k for k in (row.get("scores") or {}) if k not in score_keys]
    head = "".join(f"<th>{esc(k)}</th>" for k in ["prompt", "reference", "completion", *score_keys])
    rows = []
    for row in run.predictions:
        scores = row.get("scores") or {}
        cells = [f"<td><pre>{esc(_text(row.get(k, '')))}</pre></td>" for k in ("prompt", "reference", "completion")]
        cells += [f'<td class="num">{esc(fmt(scores.get(k)))}</td>' for k in score_keys]
        rows.append(f"<tr>{''.join(cells)}</tr>")
    shown = len(run.predictions)
    note = f"{run.predictions_total} rows, worst first" + (f" (the worst {shown} shown)" if shown < run.predictions_total
                                                           else "")
    return (f'<h3>{esc(run.label)}: predictions.jsonl <span class="note">{esc(note)}</span></h3>'
            f'<input class="search" type="search" placeholder="filter rows (any text)" '
            f'data-table="pred-{esc(run.label)}">'
            f'<table class="rows" id="pred-{esc(run.label)}"><tr>{head}</tr>{"".join(rows)}</table>')


def _completions(run: RunFacts) -> str:
    if not run.completions:
        return ""
    reward_keys: list[str] = []
    for row in run.completions:
        reward_keys += [k for k in (row.get("rewards") or {}) if k not in reward_keys]
    extra = [k for k in ("advantage",) if any(k in r for r in run.completions)]
    head = "".join(f"<th>{esc(k)}</th>" for k in ["step", "prompt", "completion", *reward_keys, *extra])
    rows = []
    for row in run.completions:
        rewards = row.get("rewards") or {}
        cells = [f'<td class="num">{esc(fmt(row.get("step")))}</td>',
                 f"<td><pre>{esc(_text(row.get('prompt', '')))}</pre></td>",
                 f"<td><pre>{esc(_text(row.get('completion', '')))}</pre></td>"]
        cells += [f'<td class="num">{esc(fmt(rewards.get(k)))}</td>' for k in reward_keys]
        cells += [f'<td class="num">{esc(fmt(row.get(k)))}</td>' for k in extra]
        rows.append(f"<tr>{''.join(cells)}</tr>")
    return (f"<h3>{esc(run.label)}: sampled completions with their rewards</h3>"
            f'<input class="search" type="search" placeholder="filter rows (any text)" '
            f'data-table="comp-{esc(run.label)}">'
            f'<table class="rows" id="comp-{esc(run.label)}"><tr>{head}</tr>{"".join(rows)}</table>')


def _recipe(run: RunFacts) -> str:
    """The resolved recipe, key by key, with where each value came from (`ftune show --origin`)."""
    rows: list[str] = []

    def walk(value: object, path: str, depth: int) -> None:
        origin = run.origins.get(path, "") if path else ""
        pad = f' style="padding-left:{depth * 1.2:.1f}em"'
        if isinstance(value, dict) and value:
            if path:
                rows.append(f'<tr><th{pad}>{esc(path.rpartition(".")[2])}</th><td></td>'
                            f'<td class="origin">{esc(origin)}</td></tr>')
            for k, v in value.items():
                walk(v, f"{path}.{k}" if path else str(k), depth + (1 if path else 0))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            rows.append(f'<tr><th{pad}>{esc(path.rpartition(".")[2])}</th><td></td>'
                        f'<td class="origin">{esc(origin)}</td></tr>')
            for i, v in enumerate(value):
                walk(v, f"{path}.{i}", depth + 1)
        else:
            rows.append(f'<tr><th{pad}>{esc(path.rpartition(".")[2])}</th><td>{esc(json.dumps(value))}</td>'
                        f'<td class="origin">{esc(origin or ("" if run.origins else "not recorded"))}</td></tr>')

    walk(run.recipe, "", 0)
    note = "" if run.origins else ' <span class="note">(this run dir records no origins: an older ftune)</span>'
    return (f"<details><summary>{esc(run.label)}: the resolved recipe, with each value's origin{note}</summary>"
            f'<table class="recipe"><tr><th>key</th><th>value</th><th>origin</th></tr>{"".join(rows)}</table>'
            f"</details>")


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _memory(run: RunFacts) -> list[tuple[str, str]]:
    """The measured peak (CUDA: summary.json) against `ftune plan`'s estimate (estimate.json, `output.report`)."""
    peak = run.summary.get("peak_memory_bytes")
    estimate = run.estimate.get("peak_bytes")
    measured = isinstance(peak, (int, float)) and not isinstance(peak, bool)
    rows = [("measured peak memory", f"{_gib(peak)} (GPU, allocated)" if measured else
             "not measured (measured on CUDA, at the end of a finished run)")]
    if isinstance(estimate, (int, float)):
        where = run.estimate.get("device", "")
        rows.append(("plan's estimate", f"{_gib(estimate)} per {where or 'device'} (peak: {run.estimate.get('peak_phase')})"
                     + (f"; measured ÷ estimated {peak / estimate:.2f}" if measured and estimate else "")))
        for item in run.estimate.get("items") or []:
            rows.append((f"  {item.get('kind')}", f"{_gib(item.get('bytes', 0))} · {item.get('detail', '')} "
                         f"({item.get('phase', '')})"))
    else:
        rows.append(("plan's estimate", "not recorded (`output.report: true` records it; `ftune plan` prints it)"))
    return rows


def render(runs: list[RunFacts], charts: list[Chart]) -> str:
    """The page for one run, or several compared."""
    title = " vs ".join(run.name for run in runs)
    facts = "".join(f'<div class="run"><h3>{esc(run.label)}</h3>'
                    + _table(run.header(), "facts", f' data-run="{esc(run.label)}" data-status="{esc(run.status.kind)}"')
                    + _table(_memory(run), "facts memory") + "</div>" for run in runs)
    chart_divs = "".join(f'<div class="chart" data-chart="{esc(c.id)}" data-expected="{c.points}">'
                         f'<h3>{esc(c.title)}{f" ({esc(c.unit)})" if c.unit else ""}</h3><div class="plot"></div></div>'
                         for c in charts) or '<p class="empty">no metrics logged yet</p>'
    diff = ""
    if len(runs) > 1:
        rows = recipe_diff(runs)
        head = "".join(f"<th>{esc(run.label)}</th>" for run in runs)
        body = "".join(f"<tr><th>{esc(k)}</th>{''.join(f'<td>{esc(v)}</td>' for v in values)}</tr>"
                       for k, values in rows) or f'<tr><td colspan="{len(runs) + 1}">the recipes are equal</td></tr>'
        diff = (f'<section id="diff"><h2>recipe diff <span class="note">(only the keys that differ)</span></h2>'
                f'<table class="diff"><tr><th>key</th>{head}</tr>{body}</table></section>')
    predictions = "".join(_predictions(run) for run in runs)
    completions = "".join(_completions(run) for run in runs)
    data = {"charts": [{"id": c.id, "title": c.title, "unit": c.unit, "lines": c.lines} for c in charts],
            "runs": [run.label for run in runs]}
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="generator" content="{GENERATOR} {esc(__version__)}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>ftune report · {esc(title)}</title>
<script>{_asset("errors.js")}</script>
<style>{_asset("page.css")}</style>
</head>
<body data-ready="0">
<header><h1>ftune report · {esc(title)}</h1></header>
<section id="runs"><h2>{"runs" if len(runs) > 1 else "run"}</h2><div class="runs">{facts}</div></section>
<section id="charts"><h2>curves{" (overlaid)" if len(runs) > 1 else ""}</h2><div class="charts">{chart_divs}</div></section>
<section id="metrics"><h2>final metrics</h2>{_metrics_table(runs)}</section>
{diff}
{f'<section id="predictions"><h2>predictions</h2>{predictions}</section>' if predictions else ""}
{f'<section id="completions"><h2>RL completions</h2>{completions}</section>' if completions else ""}
<section id="recipe"><h2>recipe</h2>{"".join(_recipe(run) for run in runs)}</section>
<section id="plan"><h2>plan decisions <span class="note">(plan.json)</span></h2>
{"".join(f"<details><summary>{esc(run.label)}</summary>" + _table(run.decisions(), "facts plan") + "</details>"
         for run in runs)}</section>
<footer>written by {GENERATOR} {esc(__version__)} · one file, nothing fetched</footer>
<pre id="js-errors"></pre>
<script type="application/json" id="report-data">{_script_json(data)}</script>
<script>{_asset("page.js")}</script>
</body></html>
"""
