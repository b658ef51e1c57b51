"""`pip install ftune` (no extras) is the light install: validate and show work, torch is absent, and a
heavy command says which extra to install, with exit 2.

Builds the wheel from a copy of the source, installs it into a fresh virtualenv (pydantic, PyYAML,
omegaconf and rich come from the package index; skipped when it is unreachable) and runs its `ftune`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "peft", "accelerate", "datasets", "bitsandbytes")
OFFLINE = ("NewConnectionError", "Failed to establish", "Temporary failure in name resolution",
           "No matching distribution found", "Could not find a version", "Network is unreachable")

pytestmark = pytest.mark.slow


def _run(cmd: list, cwd: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("light")
    src = tmp / "src"  # a copy, so the build leaves no build/ or *.egg-info in the checkout
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "ftune", src / "ftune", ignore=shutil.ignore_patterns("__pycache__"))
    try:
        import setuptools  # noqa: F401  # build with it, offline; else pip fetches it for an isolated build

        isolation = ["--no-build-isolation"]
    except ImportError:
        isolation = []
    built = _run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", *isolation, "-q", "-w", tmp / "dist"], src)
    if built.returncode and any(m in built.stderr for m in OFFLINE):
        pytest.skip("the package index is unreachable (building needs setuptools)")
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp / "dist").glob("ftune-*.whl")

    venv.EnvBuilder(with_pip=True).create(tmp / "venv")
    py = tmp / "venv" / "bin" / "python"
    installed = _run([py, "-m", "pip", "install", "-q", wheel], tmp, timeout=300)
    if installed.returncode and any(m in installed.stderr for m in OFFLINE):
        pytest.skip("the package index is unreachable: the light install needs pydantic, PyYAML, omegaconf, rich")
    assert installed.returncode == 0, installed.stderr
    return tmp / "venv" / "bin"


def test_light_install_has_no_training_stack(light_venv):
    probe = "import importlib.util as u; print(','.join(m for m in %r if u.find_spec(m)))" % (HEAVY,)
    found = _run([light_venv / "python", "-c", probe], REPO)
    assert found.returncode == 0 and found.stdout.strip() == "", found.stdout + found.stderr
    torch = _run([light_venv / "python", "-c", "import torch"], REPO)
    assert torch.returncode == 1 and "No module named 'torch'" in torch.stderr


def test_validate_and_show_work(light_venv):
    checked = _run([light_venv / "ftune", "validate", "recipes/"], REPO)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "recipes/llama7b-lora.yaml: ok" in checked.stdout and "all valid" in checked.stdout
    github = _run([light_venv / "ftune", "validate", "--format", "github", "recipes/"], REPO)
    assert (github.returncode, github.stdout) == (0, "")
    shown = _run([light_venv / "ftune", "show", "recipes/llama7b-qlora.yaml"], REPO)
    assert shown.returncode == 0 and "name: llama7b-qlora" in shown.stdout


@pytest.mark.parametrize("argv", [["run", "recipes/llama7b-lora.yaml"], ["plan", "recipes/llama7b-lora.yaml"]])
def test_heavy_command_names_the_extra(light_venv, argv):
    proc = _run([light_venv / "ftune", *argv], REPO)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"`ftune {argv[0]}` needs the training stack; not installed: torch" in proc.stderr
    assert 'pip install "ftune[train]"' in proc.stderr and "Traceback" not in proc.stderr
