"""The `ftune-validate` pre-commit hook, as a team would try it: `pre-commit try-repo` against this
repository's committed HEAD, on a repository holding recipes. pre-commit installs ftune without extras into
its own environment (from the package index; skipped when unreachable, or when pre-commit is not installed)."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OFFLINE = ("NewConnectionError", "Failed to establish", "Temporary failure in name resolution",
           "No matching distribution found", "Could not find a version", "Network is unreachable")

pytestmark = pytest.mark.slow


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd, check=True, capture_output=True)


def _try_repo(cwd: Path, home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PRE_COMMIT_HOME"] = str(home)
    import pre_commit

    where = str(Path(pre_commit.__file__).resolve().parents[1])
    if where not in {str(Path(p).resolve()) for p in site.getsitepackages()}:  # installed with --target
        env["PYTHONPATH"] = where
    cmd = [sys.executable, "-m", "pre_commit", "try-repo", str(REPO), "ftune-validate", "--all-files"]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.extended  # pre-commit builds a fresh environment: make test-all
def test_try_repo_passes_then_reports_a_typo(tmp_path):
    pytest.importorskip("pre_commit", reason="pre-commit is not installed")
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    if (REPO / ".pre-commit-hooks.yaml").read_text() != subprocess.run(
        ["git", "show", "HEAD:.pre-commit-hooks.yaml"], cwd=REPO, capture_output=True, text=True
    ).stdout:
        pytest.skip("try-repo uses the committed hook definition; .pre-commit-hooks.yaml has uncommitted changes")
    team = tmp_path / "team"
    shutil.copytree(REPO / "recipes", team / "recipes", ignore=shutil.ignore_patterns("assets"))
    _git(team, "init", "-q")
    _git(team, "add", "-A")
    _git(team, "commit", "-qm", "recipes")

    ok = _try_repo(team, tmp_path / "home")
    if ok.returncode and any(m in ok.stdout + ok.stderr for m in OFFLINE):
        pytest.skip("the package index is unreachable: the hook's environment installs ftune's light dependencies")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "ftune validate" in ok.stdout and "Passed" in ok.stdout

    lora = team / "recipes" / "llama7b-lora.yaml"
    lora.write_text(lora.read_text().replace("\n  r: 8\n", "\n  rnak: 8\n"))
    bad = _try_repo(team, tmp_path / "home")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "Failed" in bad.stdout
    assert "recipes/llama7b-lora.yaml:23:3: error: peft.rnak: unknown key (did you mean 'r'?)" in bad.stdout
