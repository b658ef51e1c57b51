"""Data at scale: ftune's chat preprocessing against a plain `datasets` pipeline on the same rows, per size.

Each side runs in its own process (so peak memory is its own), rounds alternate between the sides, and the
figures are medians with the range over rounds:

- plain: `load_dataset("json")`, `apply_chat_template` per row, one batched tokenizer call, `datasets.map`
  with batches of 1000 (what a practitioner writes; no labels, no packing).
- ftune: `ftune.datastage.build` of a recipe with that file as `format: chat`, cold cache, `max_seq_length`
  128, packing on: render, mask the prompts, pack, shuffle, write the cache entry.

Both produce the same token count (asserted). Memory: peak RSS (`ru_maxrss`), and the peak of anonymous memory
(`RssAnon`, sampled every 50 ms), since RSS also counts pages of memory-mapped Arrow files that the kernel can
drop at will.

Run: `.venv/bin/python bench/bench_data_scale.py [ROWS ...] [--rounds R] [--parallel] [--num-proc 1,2]` (default
10000 50000, 3 rounds; `--parallel` runs the two sides of a round at the same time); `make bench` runs the default.
The ftune side also times a warm rerun (a cache hit) after its cold build: `warm_over_cold`. `--num-proc 1,2` runs
the ftune side once per `data.num_proc` setting in each round (interleaved, the plain side after them) and reports
rows/s and CPU seconds (its worker processes' included) per setting, `num_proc`; the ratios are the first setting's.
`renders_per_row`: chat-template renders per row for the answer spans (ftune/datafiles/spans.py), on the first 1,000 rows.
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORDS = ("the cat sat on a mat and dog ran in park while birds sang songs about rain sun wind people read "
         "books write code train models fine tune small networks learn fast answer questions").split()
SEQ = 128


def write_rows(path: Path, n: int, seed: int = 0) -> None:
    """Chat rows: 1-3 user/assistant turns, a system turn in 30% of them, 3-40 words per message."""
    rng = random.Random(seed)
    with path.open("w") as fh:
        for _ in range(n):
            msgs = []
            if rng.random() < 0.3:
                msgs.append({"role": "system", "content": "you are " + " ".join(rng.choices(WORDS, k=4))})
            for _ in range(rng.choice([1, 1, 2, 3])):
                msgs.append({"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(3, 25)))})
                msgs.append({"role": "assistant", "content": " ".join(rng.choices(WORDS, k=rng.randint(3, 40)))})
            fh.write(json.dumps({"messages": msgs}) + "\n")


class _AnonPeak(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0

    def run(self) -> None:
        while True:
            with open("/proc/self/status") as fh:
                for line in fh:
                    if line.startswith("RssAnon:"):
                        self.peak = max(self.peak, int(line.split()[1]) // 1024)
            time.sleep(0.05)


def _cpu() -> float:
    """CPU seconds of this process and of its reaped children (`data.num_proc` workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def side(name: str, data: str, tok_dir: str, num_proc: str = "0") -> dict:
    """One side's run in this process: wall seconds, tokens, peak RSS and anonymous MiB."""
    import datasets
    from transformers import AutoTokenizer

    from ftune.recipe.schema import Recipe
    from ftune.plan.batching import data_plan
    from ftune.datastage import build as stage

    def build(r, tok, **kw):  # the data stage with the compiler's decisions for one process
        return stage(r, tok, data_plan(r, step_samples=r.train.per_device_batch_size), **kw)
    from ftune.datafiles.formats import DEFAULT_CHAT_TEMPLATE

    datasets.disable_progress_bars()
    tok = AutoTokenizer.from_pretrained(tok_dir)
    work = tempfile.mkdtemp(prefix="ftune-bench-scale-")
    sampler = _AnonPeak()
    sampler.start()
    start, cpu0 = time.perf_counter(), _cpu()
    if name == "ftune":
        procs = {"num_proc": int(num_proc)} if int(num_proc) else {}
        recipe = Recipe.model_validate({"name": "b", "model": {"path": "unused"}, "data": {
            "train": [{"path": data, "format": "chat"}], "max_seq_length": SEQ, "packing": True, "cache_dir": work,
            **procs}})
        report = build(recipe, tok, log=lambda _: None).report
        tokens, fill = report.tokens, report.fill
        cold, cold_cpu = time.perf_counter() - start, _cpu() - cpu0
        again = time.perf_counter()
        assert build(recipe, tok, log=lambda _: None).report.cache_hit
        warm = time.perf_counter() - again
    else:
        import pyarrow.compute as pc

        ds = datasets.load_dataset("json", data_files=data, split="train", cache_dir=work)

        def encode(batch):
            texts = [tok.apply_chat_template(m, chat_template=DEFAULT_CHAT_TEMPLATE, tokenize=False)
                     for m in batch["messages"]]
            ids = [x[:SEQ] for x in tok(texts, add_special_tokens=False)["input_ids"]]
            return {"input_ids": ids, "labels": ids}

        out = ds.map(encode, batched=True, batch_size=1000, remove_columns=ds.column_names)
        tokens = int(pc.sum(pc.list_value_length(out.data.column("input_ids"))).as_py())
        fill = warm = None
    wall, cpu = time.perf_counter() - start, _cpu() - cpu0
    if warm is not None:  # the cold build alone: the warm rerun is reported on its own
        wall, cpu = cold, cold_cpu
    shutil.rmtree(work, ignore_errors=True)
    return {"wall": wall, "cpu": cpu, "warm": warm, "load": os.getloadavg()[0], "tokens": tokens, "fill": fill, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            // 1024, "anon_mb": sampler.peak}


def _start_side(name: str, data: Path, tok_dir: Path, num_proc: int = 0) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen([sys.executable, __file__, "--side", name, str(data), str(tok_dir), str(num_proc)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"a side failed ({proc.returncode}): {err[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])


def _run_side(name: str, data: Path, tok_dir: Path, num_proc: int = 0) -> dict:
    return _result(_start_side(name, data, tok_dir, num_proc))


def renders_per_row(data: Path, tok_dir: Path, rows: int = 1000) -> float:
    """Chat-template renders a row costs for its answer spans, on the first `rows` rows (ftune's default template,
    the one this tokenizer gets)."""
    from transformers import AutoTokenizer

    from ftune.datafiles.chat_rows import DEFAULT_CHAT_TEMPLATE, ChatRenderer
    from ftune.datafiles.spans import render_with_spans

    render = ChatRenderer(AutoTokenizer.from_pretrained(tok_dir), DEFAULT_CHAT_TEMPLATE)
    with data.open() as fh:
        convs = [json.loads(line)["messages"] for _, line in zip(range(rows), fh)]
    for conv in convs:
        render_with_spans(render, conv)
    return round(render.renders / len(convs), 3)


def measure(sizes: list[int], rounds: int, parallel: bool = False, num_procs: tuple[int, ...] = ()) -> dict:
    """`parallel`: both sides of a round run at the same time (each still in its own process), for sizes whose
    rounds would not fit a session on a loaded machine; the CPU-second ratio is then the steadier figure."""
    from ftune.tiny import train_tokenizer

    work = Path(tempfile.mkdtemp(prefix="ftune-bench-scale-"))
    figures = {}
    try:
        train_tokenizer([" ".join(WORDS)] * 50 + ["User: Assistant: System:"], work / "tok", vocab_size=384)
        for n in sizes:
            data = work / f"chat-{n}.jsonl"
            write_rows(data, n)
            runs = {"ftune": [], "plain": []}
            extra = {k: [] for k in num_procs[1:]}  # the further num_proc settings, ftune side only
            for _ in range(rounds):
                if parallel:
                    procs = {name: _start_side(name, data, work / "tok", num_procs[0] if num_procs and
                                               name == "ftune" else 0) for name in ("ftune", "plain")}
                    for name, proc in procs.items():
                        runs[name].append(_result(proc))
                    for k in extra:
                        extra[k].append(_run_side("ftune", data, work / "tok", k))
                    continue
                runs["ftune"].append(_run_side("ftune", data, work / "tok", num_procs[0] if num_procs else 0))
                for k in extra:
                    extra[k].append(_run_side("ftune", data, work / "tok", k))
                runs["plain"].append(_run_side("plain", data, work / "tok"))
            assert runs["ftune"][0]["tokens"] == runs["plain"][0]["tokens"], "the two sides tokenized differently"
            ratios = [p["wall"] / f["wall"] for f, p in zip(runs["ftune"], runs["plain"])]
            row = {
                "rows": n, "tokens": runs["ftune"][0]["tokens"], "fill": round(runs["ftune"][0]["fill"], 4),
                "ftune_rows_per_s": round(n / statistics.median(r["wall"] for r in runs["ftune"])),
                "plain_rows_per_s": round(n / statistics.median(r["wall"] for r in runs["plain"])),
                "rows_per_s_ratio": round(statistics.median(ratios), 3),
                "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
                "ftune_peak_rss_mb": max(r["rss_mb"] for r in runs["ftune"]),
                "plain_peak_rss_mb": max(r["rss_mb"] for r in runs["plain"]),
                "ftune_peak_anon_mb": max(r["anon_mb"] for r in runs["ftune"]),
                "plain_peak_anon_mb": max(r["anon_mb"] for r in runs["plain"]),
            }
            cpu = [p["cpu"] / f["cpu"] for f, p in zip(runs["ftune"], runs["plain"])]
            row["cpu_ratio"] = round(statistics.median(cpu), 3)  # rows per CPU second, ftune / plain
            row["cpu_ratio_range"] = [round(min(cpu), 3), round(max(cpu), 3)]
            row["walls"] = {k: [round(r["wall"], 1) for r in v] for k, v in runs.items()}
            row["cpus"] = {k: [round(r["cpu"], 1) for r in v] for k, v in runs.items()}
            row["rss_ratio"] = round(row["ftune_peak_rss_mb"] / row["plain_peak_rss_mb"], 2)
            warm = [r["warm"] / r["wall"] for r in runs["ftune"]]
            row["warm_over_cold"] = round(statistics.median(warm), 4)
            row["warm_s"] = [round(r["warm"], 2) for r in runs["ftune"]]
            row["load_1min"] = [round(r["load"], 1) for v in runs.values() for r in v]
            row["renders_per_row"] = renders_per_row(data, work / "tok")
            if num_procs:
                row["num_proc"] = {str(k): {
                    "rows_per_s": round(n / statistics.median(r["wall"] for r in v)),
                    "cpu_s": round(statistics.median(r["cpu"] for r in v), 1),
                    "walls": [round(r["wall"], 1) for r in v], "cpus": [round(r["cpu"], 1) for r in v]}
                    for k, v in {num_procs[0]: runs["ftune"], **extra}.items()}
                assert all(r["tokens"] == row["tokens"] for v in extra.values() for r in v), "num_proc changed tokens"
            figures[str(n)] = row
            print(f"  {n:>8} rows: ftune/plain rows/s {row['rows_per_s_ratio']} ({row['ratio_range'][0]}-"
                  f"{row['ratio_range'][1]}), per CPU second {row['cpu_ratio']} ({row['cpu_ratio_range'][0]}-"
                  f"{row['cpu_ratio_range'][1]}), peak RSS {row['ftune_peak_rss_mb']} vs {row['plain_peak_rss_mb']} MiB, "
                  f"anon {row['ftune_peak_anon_mb']} vs {row['plain_peak_anon_mb']} MiB, fill {row['fill']}, warm/cold "
                  f"{row['warm_over_cold']}, load {row['load_1min']}, renders a row {row['renders_per_row']}"
                  + "".join(f"; num_proc {k}: {v['rows_per_s']} rows/s, {v['cpu_s']} CPU s"
                            for k, v in row.get("num_proc", {}).items()), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return figures


def main() -> dict:
    return measure([10_000, 50_000], 3)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--side"]:
        print(json.dumps(side(*sys.argv[2:6])))
    else:
        args = sys.argv[1:]
        rounds = int(args[args.index("--rounds") + 1]) if "--rounds" in args else 3
        num_procs = tuple(int(k) for k in args[args.index("--num-proc") + 1].split(",")) if "--num-proc" in args else ()
        sizes = [int(a) for i, a in enumerate(args) if a.isdigit() and (i == 0 or args[i - 1] not in ("--rounds",
                                                                                                   "--num-proc"))]
        print(json.dumps(measure(sizes or [10_000, 50_000], rounds, "--parallel" in args, num_procs), indent=1))
