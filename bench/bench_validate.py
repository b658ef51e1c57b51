"""`ftune validate recipes/` wall time ÷ `python -c "import torch"` wall time, measured in one run.

Both are fresh subprocesses (interpreter start-up included), each the median of 5 runs, so the
ratio compares like with like on whatever machine runs it. Goal: ≤ 0.3.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUNS = 5
GOAL = 0.3


def _median_wall(argv: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return statistics.median(times)


def main() -> dict:
    subprocess.run([sys.executable, "-c", "import torch"], check=True)  # warm the OS file cache for both sides
    subprocess.run([sys.executable, "-m", "ftune.cli.main", "validate", "recipes/"], cwd=REPO, capture_output=True)
    validate_s = _median_wall([sys.executable, "-m", "ftune.cli.main", "validate", "recipes/"])
    torch_s = _median_wall([sys.executable, "-c", "import torch"])
    recipes = sum(1 for _ in (REPO / "recipes").rglob("*.yaml"))
    result = {
        "validate_recipes_s": round(validate_s, 3),
        "import_torch_s": round(torch_s, 3),
        "ratio": round(validate_s / torch_s, 3),
        "goal": GOAL,
        "yaml_files": recipes,
        "runs": RUNS,
    }
    print(
        f"ftune validate recipes/ ({recipes} files): {validate_s:.3f}s; import torch: {torch_s:.3f}s; "
        f"ratio {result['ratio']:.3f} (goal <= {GOAL})"
    )
    return result


if __name__ == "__main__":
    main()
