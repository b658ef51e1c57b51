"""`ftune launch-script` can't be injected (issue #37): hypothesis draws every argument (the recipe's file name, the
overrides, `-o`, and each target's options) from strings with newlines, quotes, backticks, `$()`, `;`, `#` and
YAML's other line breaks. Each draw is refused as usage (exit 2) or gives a spec that means what was asked:

- slurm: the script parses (`bash -n`), every line before `set -euo pipefail` is a comment or `#SBATCH`, and run
  with stub `srun`/`scontrol`/`ftune`, the node's `ftune` gets exactly `run RECIPE OVERRIDES...`;
- kubernetes: the header is comments only, and the YAML loads with exactly the TrainJob's keys, the container's
  command ending in the recipe and the overrides unchanged;
- skypilot: the same for the task's keys; `setup` and `run` parse, and run with stubs they pip-install exactly
  `--install` and call `ftune run RECIPE OVERRIDES... <the job keys>`.

Draws stay few (`EXAMPLES`) to keep `make test` quick; in-process writers, one bash per check."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftune.errors import RecipeError, UsageError
from ftune.launch.jobs import kubernetes, skypilot, slurm
from ftune.launch.jobs.common import Request

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

EXAMPLES = int(os.environ.get("FTUNE_FUZZ_EXAMPLES", "12"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))
RECIPE = """name: mn
model: {path: m}
data: {train: [{path: d.jsonl}]}
distributed: {strategy: fsdp, num_processes: 4}
train: {epochs: 1}
"""
PAYLOADS = ["\n", "\r", "\u2028", "\x85", "$(touch pwned)", "`touch pwned`", "'", '"', "\\", ";", "#", "a: b",
            "\nkind: Pod", "\ntouch pwned\n", "${x}", " ", "\t", "-", "|", "&"]
HOSTILE = st.lists(st.sampled_from(PAYLOADS) | st.text(alphabet="ab.:/=", min_size=1, max_size=3),
                   min_size=1, max_size=5).map("".join)
def _option(*plain: str):
    """An option's draw: unset, a plain value, or a hostile one."""
    return st.none() | st.sampled_from(plain) | HOSTILE


OVERRIDE_KEYS = ("model.path", "output.dir", "data.train[0].path", "model.revision")


def _file_name(text: str) -> str:
    name = text.replace("/", "_").replace("\0", "_")
    return "r" + name + ".yaml"


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    # the commands a spec runs, each printing its argv NUL-separated into $ARGS_OUT
    for tool in ("ftune", "pip"):
        (stubs / tool).write_text(f"#!/bin/bash\nprintf '%s\\0' {tool} \"$@\" >> \"$ARGS_OUT\"\n")
        (stubs / tool).chmod(0o755)
    return tmp_path


def _bash(folder: Path, script: str, *, prelude: str = "", env: dict | None = None) -> list[str]:
    """Run `script` with the stubs first on PATH; the argv of every stubbed command it ran."""
    out = folder / "args.bin"
    out.write_bytes(b"")
    path = folder / "script.sh"
    path.write_text(script)
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    wrapper = f"{prelude}\nexport -f srun scontrol 2>/dev/null || true\nbash \"$0\""
    res = subprocess.run(["bash", "-c", wrapper, str(path)], cwd=folder, capture_output=True, text=True,
                         env={**os.environ, "PATH": f"{folder / 'stubs'}:{os.environ['PATH']}",
                              "ARGS_OUT": str(out), **(env or {})})
    assert res.returncode == 0, res.stderr
    assert not (folder / "pwned").exists()
    return out.read_bytes().decode().split("\0")[:-1]


def _request(folder: Path, target: str, recipe_name: str, values: list[str], output: str, **options) -> Request:
    recipe = folder / _file_name(recipe_name)
    recipe.write_text(RECIPE)
    overrides = [f"{key}=m{value}" for key, value in zip(OVERRIDE_KEYS, values)]  # m: mostly text to YAML
    return Request(target=target, recipe=recipe.name, overrides=overrides, nodes=2, output=output, **options)


def _header_then(text: str, first: str) -> list[str]:
    """The lines before the first that starts with `first`; each must be a comment."""
    lines = text.split("\n")
    end = next(i for i, line in enumerate(lines) if line.startswith(first))
    assert all(line.startswith("#") for line in lines[:end]), lines[:end]
    return lines[:end]


def _writes(module, req: Request) -> str | None:
    try:
        text = module.write(req)
    except (UsageError, RecipeError):
        return None  # refused: as usage (exit 2, an option pasted verbatim), or an override the recipe refuses
    WRITTEN.append(req.target)
    return text


WRITTEN: list[str] = []
"""Targets of the draws that gave a spec (the property is not vacuous: see the last test)."""


SRUN = r"""
scontrol() { printf 'node-a\nnode-b\n'; }
srun() { while [ "${1#--}" != "$1" ]; do shift; done; SLURM_NODEID=0 "$@"; }
"""


@SETTINGS
@given(name=HOSTILE, values=st.lists(HOSTILE, min_size=0, max_size=4), output=HOSTILE,
       partition=_option("gpu", "a100,h100"), time=_option("24:00:00", "1-00:00:00"))
def test_slurm_scripts_run_exactly_the_command_asked(folder, name, values, output, partition, time):
    req = _request(folder, "slurm", name, values, output, partition=partition, time=time)
    script = _writes(slurm, req)
    if script is None:
        return
    header = _header_then(script, "set -euo pipefail")
    assert sum(line.startswith("#SBATCH") for line in header) == 7 + (partition is not None) + (time is not None)
    argv = _bash(folder, script, prelude=SRUN, env={"SLURM_JOB_NODELIST": "node-[a-b]", "SLURM_NNODES": "2"})
    assert argv == ["ftune", "run", req.recipe, *req.overrides]


@SETTINGS
@given(name=HOSTILE, values=st.lists(HOSTILE, min_size=0, max_size=4), output=HOSTILE,
       image=st.sampled_from(["img:1", "ghcr.io/o/i@sha256:ab12"]) | HOSTILE, pvc=_option("work"),
       secret=st.sampled_from(["ftune-secrets"]) | HOSTILE)
def test_trainjobs_load_with_exactly_their_keys(folder, name, values, output, image, pvc, secret):
    req = _request(folder, "kubernetes", name, values, output, image=image, pvc=pvc, secret_name=secret)
    text = _writes(kubernetes, req)
    if text is None:
        return
    _header_then(text, "apiVersion:")
    job = yaml.safe_load(text)
    assert list(job) == ["apiVersion", "kind", "metadata", "spec"] and list(job["metadata"]) == ["name"]
    assert list(job["spec"]) == ["runtimeRef", "trainer", "runtimePatches"]
    trainer = job["spec"]["trainer"]
    assert trainer["image"] == image
    assert trainer["command"][-2 - len(values):] == ["run", req.recipe, *req.overrides]


@SETTINGS
@given(name=HOSTILE, values=st.lists(HOSTILE, min_size=0, max_size=4), output=HOSTILE,
       install=st.none() | HOSTILE, bucket=_option("my-bucket"), accelerators=_option("H100:8"))
def test_skypilot_tasks_load_with_exactly_their_keys_and_run_the_command_asked(folder, name, values, output,
                                                                               install, bucket, accelerators):
    req = _request(folder, "skypilot", name, values, output, install=install, bucket=bucket,
                   accelerators=accelerators)
    text = _writes(skypilot, req)
    if text is None:
        return
    _header_then(text, "name:")
    task = yaml.safe_load(text)
    want = ["name", "num_nodes", *(["resources"] if accelerators else []), "workdir",
            *(["file_mounts"] if bucket else []), "setup", "run"]
    assert list(task) == want
    assert _bash(folder, task["setup"]) == ["pip", "install", install or f"ftune[train]=={skypilot.__version__}"]
    argv = _bash(folder, task["run"], env={"SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2", "SKYPILOT_NUM_NODES": "2",
                                           "SKYPILOT_NODE_RANK": "1"})
    bucket_dir = [f"output.dir={skypilot.RUNS}/mn"] if bucket else []
    gpus = [f"distributed.num_processes={req.gpus_per_node}"] if req.gpus_per_node else []  # from --accelerators
    assert argv == ["ftune", "run", req.recipe, *req.overrides, *gpus, *bucket_dir, "distributed.num_machines=2",
                    "distributed.machine_rank=1", "distributed.main_process_ip=10.0.0.1",
                    "distributed.main_process_port=29500"]


@pytest.mark.parametrize("target", ["slurm", "kubernetes", "skypilot"])
def test_a_hostile_output_path_stays_in_its_comment(folder, target):
    """The finding: `-o` was pasted into the header unescaped (a newline ran as a line of the sbatch script)."""
    output = "job.sh\ntouch pwned\nkind: Pod\u2028x: 1"
    req = _request(folder, target, "", [], output, image="img:1")
    text = {"slurm": slurm, "kubernetes": kubernetes, "skypilot": skypilot}[target].write(req)
    assert "touch pwned\\nkind: Pod\\u2028x: 1" in text
    if target == "slurm":
        assert _bash(folder, text, prelude=SRUN, env={"SLURM_JOB_NODELIST": "n1", "SLURM_NNODES": "1"})[:2] == \
            ["ftune", "run"]
    else:
        assert "kind" not in yaml.safe_load(text) or target == "kubernetes" and yaml.safe_load(text)["kind"] == \
            "TrainJob"


@pytest.mark.parametrize(("argv", "says"), [
    (["--nodes", "99999999999999999999"], "--nodes must be at most 65536 (got 99999999999999999999)"),
    (["--nodes", "65537"], "--nodes must be at most 65536"),
    (["--nodes", "2", "--gpus-per-node", "5000"], "--gpus-per-node must be at most 1024 (got 5000)"),
    (["--nodes", "0"], "--nodes must be at least 1 (got 0)"),
])
def test_huge_or_zero_counts_are_refused(folder, capsys, argv, says):
    from ftune.cli.main import main

    (folder / "r.yaml").write_text(RECIPE)
    assert main(["launch-script", "slurm", "r.yaml", *argv]) == 2
    assert says in capsys.readouterr().err


def test_the_draws_were_not_all_refused():
    """Run after the three properties (file order): most draws give a spec, so the checks above ran."""
    for target in ("slurm", "kubernetes", "skypilot"):
        assert WRITTEN.count(target) >= EXAMPLES // 4, WRITTEN
