"""`make bench`: run every bench/bench_*.py (each has `main() -> dict`) in one process run, print and save figures.

Figures are ratios measured within one run, so they compare like with like on whatever machine runs them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(names: list[str]) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    results, failed = {}, []
    for file in sorted(HERE.glob("bench_*.py")):
        name = file.stem.removeprefix("bench_")
        if names and name not in names:
            continue
        print(f"== {name}", flush=True)
        spec = importlib.util.spec_from_file_location(file.stem, file)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
            results[name] = module.main()
        except Exception:  # noqa: BLE001 - report and go on with the other benchmarks
            traceback.print_exc()
            failed.append(name)
    out = HERE.parent / "runs" / "bench.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    print(f"saved {out}" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
