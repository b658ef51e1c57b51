"""Light commands never import the training stack: `--help`, `validate`, `show` stay fast."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "peft", "accelerate", "datasets", "bitsandbytes")

PROBE = """
import sys, runpy
sys.argv = ["ftune", *{argv!r}]
try:
    from ftune.cli.main import main
    code = main(sys.argv[1:])
finally:
    heavy = sorted(m for m in {heavy!r} if m in sys.modules)
    print("HEAVY=" + ",".join(heavy), file=sys.stderr)
sys.exit(code)
"""


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["validate", "recipes/"], ["show", "recipes/llama7b-lora.yaml"], ["show", "recipes/llama7b-qlora.yaml", "--origin"],
     ["import", "axolotl", "tests/data/import/axolotl/qlora.yml"],
     ["launch-script", "slurm", "recipes/llama7b-full-fsdp.yaml", "--nodes", "2"]],
    ids=["help", "validate", "show", "show-origin", "import", "launch-script"],
)
def test_light_command_imports_nothing_heavy(argv):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(argv=argv, heavy=HEAVY)],
        cwd=REPO, capture_output=True, text=True, timeout=120, env=env,
    )
    assert proc.returncode in (0, 2), proc.stderr  # --help exits 0 via argparse
    heavy = proc.stderr.strip().splitlines()[-1]
    assert heavy == "HEAVY=", f"{argv} imported {heavy}"
    if argv[0] != "--help":
        assert proc.returncode == 0, proc.stdout + proc.stderr
