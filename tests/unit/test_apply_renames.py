"""tools/apply_renames.py (#44's rooms): the merger runs it over other branches' files, so it must rewrite every
form an import or a module path takes, and this tree must hold no old name (it was rewritten by the same table)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("apply_renames", REPO / "tools" / "apply_renames.py")
renames = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(renames)
MODULES, NAMES = renames.read_table()


def rewrite(text: str) -> str:
    return renames.rewrite(text, MODULES, NAMES)


def test_every_form_of_an_import_is_rewritten():
    before = '''from ftune.dataset import vision, packing
from ftune.dataset import vision as vd
from ftune import moe, quiet
from ftune.modeling import build_meta_model, load_config
from ftune.plan import (accelerate, environment,  # the checks
                        trainer)
import ftune.data.sources
from ftune.estimate.memory import (
    Layout,
    ParamFact,  # noqa: F401 (a comment with parentheses)
    per_device,
)
    from ftune.plan.gguf import materialize
x = "ftune.plan.preflight.wrap_classes"  # and `ftune/plan/model.py`, ftune/dataset/, not ~/.cache/ftune/data
'''
    after = '''from ftune.datastage import vision_chat as vision
from ftune.datastage import packing
from ftune.datastage import vision_chat as vd
from ftune.models import moe
from ftune import quiet
from ftune.models.meta import build_meta_model
from ftune.models.config import load_config
from ftune.plan import accelerate, trainer
from ftune.plan.checks import environment
import ftune.datafiles.sources
from ftune.estimate.memory import Layout, per_device
from ftune.estimate.facts import ParamFact
    from ftune.launch.gguf import materialize
x = "ftune.plan.checks.preflight.wrap_classes"  # and `ftune/plan/plan.py`, ftune/datastage/, not ~/.cache/ftune/data
'''
    assert rewrite(before) == after
    assert rewrite(after) == after  # once is enough: a new name is never rewritten again


def test_this_tree_holds_no_old_name():
    files = subprocess.run(["git", "ls-files", "ftune", "tests", "docs", "README.md", "bench"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    files = [f for f in files if f.endswith((".py", ".md", ".yaml", ".txt", ".toml", ".cfg", ".ini"))
             and not f.endswith("test_apply_renames.py")]  # this file spells the old names on purpose
    done = subprocess.run([sys.executable, "tools/apply_renames.py", "--check", *files], cwd=REPO,
                          capture_output=True, text=True)
    assert (done.returncode, done.stdout.split()) == (0, [])
