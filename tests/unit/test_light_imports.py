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
     ["import", "axolotl", "tests/data/import/axolotl/qlora.yml", "--accept-changes"],
     ["launch-script", "slurm", "recipes/llama7b-full-fsdp.yaml", "--nodes", "2"],
     ["launch-script", "kubernetes", "recipes/llama7b-full-fsdp.yaml", "--nodes", "2", "--image", "img"],
     ["launch-script", "skypilot", "recipes/llama7b-full-fsdp.yaml", "--nodes", "2", "--accelerators", "H100:8"]],
    ids=["help", "validate", "show", "show-origin", "import", "launch-script", "launch-script-k8s",
         "launch-script-sky"],
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


def test_report_imports_nothing_heavy(tmp_path):
    """`ftune report` of two recorded runs (the page, the recipe diff, the charts' data): no torch."""
    runs = ["tests/data/report_runs/finished", "tests/data/report_runs/rl"]
    test_light_command_imports_nothing_heavy(["report", *runs, "--out", str(tmp_path / "r.html")])
    assert (tmp_path / "r.html").stat().st_size > 10_000


HIDDEN_PROBE = """
import importlib.util, sys
real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name.split(".")[0] in {heavy!r} else real(name, *a)
from ftune.cli.main import main
code = main({argv!r})
print("LOADED=" + ",".join(sorted(m for m in sys.modules if m.startswith("ftune.cli.") or m in {heavy!r})), file=sys.stderr)
sys.exit(code)
"""


def test_check_paths_asks_the_hf_cache_without_the_training_stack(tmp_path):
    """`validate --check-paths` looks a hub id up in the Hugging Face cache (ftune.hub: huggingface_hub's cache
    lookup, no torch): offline, the id the cache lacks is refused, naming the folder searched."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    argv = ["validate", "--check-paths", "recipes/llama7b-lora.yaml"]
    proc = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv, heavy=HEAVY)],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert proc.stderr.strip().splitlines()[-1] == "HEAVY=", proc.stderr
    assert proc.returncode == 1, proc.stdout + proc.stderr
    searched = tmp_path / "hf" / "hub" / "models--meta-llama--Llama-2-7b-hf"
    assert ("model meta-llama/Llama-2-7b-hf: no such folder here, and not in the Hugging Face cache "
            f"(searched {searched})") in proc.stdout


@pytest.mark.parametrize("command", ["run", "plan", "data", "eval", "merge", "generate", "chat"])
def test_heavy_command_without_the_stack_names_the_extra(command):
    """As on a light install: the stack is looked up (find_spec) before the command's module is imported."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [command, "recipes/llama7b-lora.yaml"]
    proc = subprocess.run(
        [sys.executable, "-c", HIDDEN_PROBE.format(argv=argv, heavy=HEAVY)],
        cwd=REPO, capture_output=True, text=True, timeout=120, env=env,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith(f"error: `ftune {command}` needs the training stack; not installed: torch, transformers")
    assert lines[1].strip().startswith('hint: pip install "ftune[train]"')
    assert lines[-1] == "LOADED=ftune.cli.console,ftune.cli.main", "the command module and the stack stay unimported"


def test_commands_table_requirements():
    from ftune.cli.main import COMMANDS, TRAIN_STACK

    light = [name for name, cmd in COMMANDS.items() if not cmd.requires]
    assert light == ["validate", "show", "report", "import", "launch-script"]
    assert COMMANDS["run"].requires == TRAIN_STACK
    assert all(set(cmd.requires) <= set(TRAIN_STACK) for cmd in COMMANDS.values())


@pytest.mark.parametrize(("argv0", "peft_loaded", "blocked"), [
    ("/venv/bin/ftune", False, True),  # the ftune process: bitsandbytes is kept out
    ("/repo/ftune/cli/main.py", False, True),  # python -m ftune.cli.main
    ("/venv/bin/pytest", False, False),  # a process that may train later (a test session): never
    ("/venv/bin/ftune", True, False),  # peft already decided at its import: too late to change
])
def test_the_planning_parent_keeps_bitsandbytes_out_only_in_its_own_process(monkeypatch, argv0, peft_loaded, blocked):
    """`ftune run`/`ftune plan` never quantize in the parent: bitsandbytes (and the torch._inductor it imports)
    costs about 1 s of CPU per run there. Blocked, find_spec reports it absent, as peft and transformers check."""
    import importlib.util

    from ftune.cli.imports import block_bitsandbytes

    monkeypatch.setattr(sys, "argv", [argv0, "run", "recipe.yaml"])
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # recorded, so the test's block is undone after it
    monkeypatch.delitem(sys.modules, "bitsandbytes")
    if peft_loaded:
        monkeypatch.setitem(sys.modules, "peft", sys.modules.get("peft") or object())
    else:
        monkeypatch.delitem(sys.modules, "peft", raising=False)
    assert block_bitsandbytes() is blocked
    assert ("bitsandbytes" in sys.modules and sys.modules["bitsandbytes"] is None) is blocked
    if blocked:
        assert importlib.util.find_spec("bitsandbytes") is None


@pytest.mark.parametrize(("kbit", "optimizer", "blocked"), [
    (None, "adamw_torch", True),
    (4, "adamw_torch", False),  # a QLoRA recipe's checks look for the package
    (None, "paged_adamw_8bit", False),  # so do a bitsandbytes optimizer's
])
def test_a_recipe_that_quantizes_with_bitsandbytes_keeps_it(monkeypatch, kbit, optimizer, blocked):
    from types import SimpleNamespace

    from ftune.cli.imports import block_bitsandbytes

    monkeypatch.setattr(sys, "argv", ["/venv/bin/ftune", "plan", "recipe.yaml"])
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # recorded, so the test's block is undone after it
    monkeypatch.delitem(sys.modules, "bitsandbytes")
    monkeypatch.delitem(sys.modules, "peft", raising=False)
    recipe = SimpleNamespace(kbit=kbit, train=SimpleNamespace(optimizer=optimizer))
    assert block_bitsandbytes(recipe) is blocked
    assert ("bitsandbytes" in sys.modules) is blocked
