"""CPU thread settings under load: steps/s of one training step loop at each setting, idle and loaded.

The work: a small Llama (4 layers, hidden 256, intermediate 688, vocab 2048; 7.3M parameters) trained in fp32
with fused AdamW at batch 8 x 128 tokens, the kind of step a CPU LoRA/full tryout runs. Each setting runs in a
fresh process (OMP_NUM_THREADS and OMP_WAIT_POLICY are read once, at OpenMP's start). "loaded" starts two
CPU-bound processes (busy Python loops) beside the run, as another user's job would. Settings and conditions
are interleaved in rounds, so the machine's own swings fall on every setting alike; the report is each
setting's steps/s per round and its ratio to the best setting of that round (median, min-max).

    python bench/bench_threads.py [--rounds 3] [--steps 8]

"ftune default" is what `ftune.plan.threads.decide` picks on this machine (the load average before each round is
recorded with it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time

from ftune.plan.threads import decide, physical_cores

STEP = textwrap.dedent('''
    import sys, time, torch
    from transformers import LlamaConfig, LlamaForCausalLM
    steps = int(sys.argv[1])
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
                      num_key_value_heads=4, vocab_size=2048, max_position_embeddings=256)
    model = LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(0, 2048, (8, 128))
    times = []
    for i in range(steps + 1):
        t = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward(); opt.step(); opt.zero_grad()
        times.append(time.perf_counter() - t)
    print(len(times[1:]) / sum(times[1:]), torch.get_num_threads())
''')

SETTINGS = {  # name -> environment
    "1 thread": {"OMP_NUM_THREADS": "1"},
    "2 threads": {"OMP_NUM_THREADS": "2"},
    "2 threads passive": {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"},
}
BUSY = "while True: pass"


def run(env: dict[str, str], steps: int) -> float:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))} | env
    out = subprocess.run([sys.executable, "-c", STEP, str(steps)], env=full, capture_output=True, text=True,
                         check=True)
    return float(out.stdout.split()[0])


def main(rounds: int = 3, steps: int = 8, settings: list[str] | None = None) -> dict:
    """`settings`: names from SETTINGS (default all; the spinning 2-thread setting takes minutes per round under
    load, so it can be left out once its collapse is measured)."""
    chosen_settings = {k: SETTINGS[k] for k in settings or SETTINGS}
    rows = []
    for r in range(rounds):
        for cond in ("idle", "loaded"):
            hogs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2 if cond == "loaded" else 0)]
            try:
                time.sleep(1 if hogs else 0)
                load = os.getloadavg()[0]
                chosen = decide("auto", 1, cores=physical_cores(), environ={}).env()
                default = next(name for name, env in SETTINGS.items() if env == chosen)
                speeds = {name: run(env, steps) for name, env in chosen_settings.items()}
            finally:
                for h in hogs:
                    h.kill()
                    h.wait()
            rows.append({"round": r + 1, "condition": cond, "load1": round(load, 2), "default": default,
                         "steps_per_s": {k: round(v, 3) for k, v in speeds.items()}})
            print(json.dumps(rows[-1]), flush=True)
    figures: dict = {"rounds": rows}
    for cond in ("idle", "loaded"):
        mine = [r for r in rows if r["condition"] == cond]
        print(f"\n{cond}: time per step ÷ the round's best setting's (median, min-max)")
        for name in [*chosen_settings, "ftune default"]:
            ratios = [max(r["steps_per_s"].values()) / r["steps_per_s"][r["default"] if name == "ftune default"
                                                                        else name] for r in mine]
            figures[f"{cond}: {name}"] = [round(statistics.median(ratios), 3), round(min(ratios), 3),
                                          round(max(ratios), 3)]
            print(f"  {name:18s} median {statistics.median(ratios):.2f}  ({min(ratios):.2f}-{max(ratios):.2f})")
        print(f"  ftune default chose: {', '.join(r['default'] for r in mine)}")
    return figures


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--settings", help="comma-separated names from SETTINGS (default: all)")
    args = p.parse_args()
    main(args.rounds, args.steps, args.settings.split(",") if args.settings else None)
