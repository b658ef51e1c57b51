"""`ftune launch-script slurm`: the sbatch script parses (`bash -n`), and each node's `ftune run` gets its own
rank and the first host's address from Slurm's environment, checked by running the script with stubbed
`srun`, `scontrol` and `ftune` and mapping each node's environment as `ftune run` does (ftune.plan.cluster)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ftune.cli.main import main
from ftune.plan.cluster import detect

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

RECIPE = """name: mn
model: {path: m}
data: {train: [{path: d.jsonl}]}
distributed: {strategy: fsdp, num_processes: 4}
train: {epochs: 1}
"""

# Stubs: scontrol lists the allocation's hosts; srun runs its command once per node with that node's
# SLURM_NODEID (as Slurm does); ftune (an executable on PATH: the node command `exec`s it) prints its argv.
FTUNE_STUB = """#!/bin/bash
echo "NODE $SLURM_NODEID"; printf 'ARG %s\\n' "$@"
for v in SLURM_NODEID SLURM_NNODES SLURM_JOB_NODELIST MASTER_ADDR MASTER_PORT; do echo "ENV $v=${!v}"; done
"""
STUBS = r"""
scontrol() { [ "$1 $2" = "show hostnames" ] && printf 'gpu-a17\ngpu-a18\ngpu-b02\n'; }
srun() {
  while [ "${1#--}" != "$1" ]; do shift; done
  for node in $(seq 0 $((SLURM_NNODES - 1))); do SLURM_NODEID=$node "$@"; done
}
export -f scontrol
export SLURM_JOB_NODELIST='gpu-a[17-18],gpu-b02' SLURM_NNODES=${SLURM_NNODES:-3}
"""


@pytest.fixture
def recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.yaml").write_text(RECIPE)
    return tmp_path / "r.yaml"


def write(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["launch-script", "slurm", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def run_nodes(script: str, stubs: Path) -> dict[int, list[str]]:
    """Run the script with the stubs; each node's ftune argv (its environment in `ENVS`)."""
    stubs.mkdir(exist_ok=True)
    (stubs / "ftune").write_text(FTUNE_STUB)
    (stubs / "ftune").chmod(0o755)
    body = script.replace("set -euo pipefail", "set -euo pipefail\n" + STUBS)
    env = {**os.environ, "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["bash", "-c", body], capture_output=True, text=True, timeout=30, env=env)
    assert proc.returncode == 0, proc.stderr
    nodes: dict[int, list[str]] = {}
    ENVS.clear()
    for line in proc.stdout.splitlines():
        if line.startswith("NODE "):
            node = int(line[5:])
            current = nodes.setdefault(node, [])
        elif line.startswith("ENV "):
            name, _, value = line[4:].partition("=")
            ENVS.setdefault(node, {})[name] = value
        else:
            current.append(line.removeprefix("ARG "))
    return nodes


ENVS: dict[int, dict[str, str]] = {}


def job(rank: int):
    """What node `rank`'s `ftune run` makes of its environment."""
    found, problems = detect(ENVS[rank])
    assert problems == []
    return found


def test_script_parses_and_has_sbatch_header(recipe, tmp_path, capsys):
    code, _, err = write(capsys, "r.yaml", "--nodes", "3", "--gpus-per-node", "8", "-o", "job.sbatch")
    assert code == 0 and "submit with `sbatch job.sbatch`" in err
    script = (tmp_path / "job.sbatch").read_text()
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")], capture_output=True).returncode == 0
    header = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert header[:4] == ["#SBATCH --job-name=mn", "#SBATCH --nodes=3", "#SBATCH --ntasks-per-node=1",
                          "#SBATCH --gpus-per-node=8"]
    assert (tmp_path / "job.sbatch").stat().st_mode & 0o111
    # preemption / time limit: SIGTERM 120 s ahead (each worker checkpoints), then the job is requeued
    assert "#SBATCH --requeue" in header and "#SBATCH --signal=TERM@120" in header


def test_each_node_gets_its_rank_and_the_first_host(recipe, tmp_path, capsys):
    code, script, _ = write(capsys, "r.yaml", "--nodes", "3", "--gpus-per-node", "8", "train.learning_rate=1e-4",
                            "output.dir=runs/it's a dir")
    assert code == 0
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    nodes = run_nodes(script, tmp_path / "bin")
    assert sorted(nodes) == [0, 1, 2]
    for rank, argv in nodes.items():
        assert argv == ["run", "r.yaml", "train.learning_rate=1e-4", "output.dir=runs/it's a dir",
                        "distributed.num_processes=8"]  # overrides arrive as one argument each
        found = job(rank)
        assert (found.launcher, found.num_machines, found.machine_rank) == ("slurm", 3, rank)
        assert (found.main_process_ip, found.main_process_port) == ("gpu-a17", 29500)  # the first host, everywhere
        assert found.sources["distributed.main_process_ip"] == "MASTER_ADDR=gpu-a17"


def test_recipe_port_and_gpus_from_the_recipe(recipe, tmp_path, capsys):
    (tmp_path / "p.yaml").write_text(RECIPE.replace("num_processes: 4", "num_processes: 4, main_process_port: 31000"))
    code, script, _ = write(capsys, "p.yaml", "--nodes", "2")
    assert code == 0 and "#SBATCH --gpus-per-node=4" in script
    nodes = run_nodes(script.replace("set -euo", "export SLURM_NNODES=2; set -euo"), tmp_path / "bin")
    assert sorted(nodes) == [0, 1]
    assert (job(1).main_process_port, job(1).num_machines, job(1).machine_rank) == (31000, 2, 1)


def test_strategy_none_is_refused_with_a_hint(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "one.yaml").write_text(RECIPE.replace("{strategy: fsdp, num_processes: 4}", "{strategy: none}"))
    code, out, err = write(capsys, "one.yaml", "--nodes", "2")
    assert code == 1 and out == ""
    assert "one.yaml:4:" in err and "distributed.strategy is 'none'" in err
    assert "hint: set `distributed.strategy: ddp`" in err


def test_invalid_recipe_and_job_keys_are_refused(recipe, tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text(RECIPE.replace("epochs: 1", "epochs: -1"))
    code, _, err = write(capsys, "bad.yaml", "--nodes", "2")
    assert code == 1 and "bad.yaml:5:" in err and "train.epochs" in err
    code, _, err = write(capsys, "r.yaml", "--nodes", "2", "distributed.machine_rank=1")
    assert code == 2 and "takes distributed.num_machines" in err
    code, _, err = write(capsys, "r.yaml", "--nodes", "2", "--partition", "a b")
    assert code == 2 and "--partition" in err
