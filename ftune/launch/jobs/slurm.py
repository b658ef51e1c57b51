"""Slurm: an sbatch script that runs one `ftune run` per node, the same recipe everywhere.

Each node's `ftune run` reads its rank and the node count from Slurm's environment on that node (`SLURM_NODEID`,
`SLURM_NNODES`: `ftune.plan.cluster`); the script exports node 0's address (`scontrol show hostnames`, the first
host) and a port as MASTER_ADDR / MASTER_PORT, which srun passes to every task.

`--requeue` and `--signal=TERM@120`: before the time limit or a preemption Slurm sends SIGTERM, each worker
saves a checkpoint of the step it is on and exits; the requeued job resumes from the last complete checkpoint (`checkpoint.resume: auto`).
"""

from __future__ import annotations

import os
import shlex

from ftune.launch.jobs.common import DEFAULT_PORT, SBATCH_VALUE, Request, check, comment, no_space

SUBMIT = "sbatch {file}"
GRACE_S = 120
"""Seconds between Slurm's SIGTERM and the kill: time to save a checkpoint of the current step."""



def write(req: Request) -> str:
    loaded, overrides, gpus = check(req)
    r = loaded.recipe
    port = r.distributed.main_process_port or DEFAULT_PORT
    argv = ["ftune", "launch-script", "slurm", req.recipe, f"--nodes={req.nodes}"]
    if req.gpus_per_node is not None:
        argv.append(f"--gpus-per-node={req.gpus_per_node}")
    argv += req.overrides
    lines = [
        "#!/bin/bash",
        f"# Written by `{comment(shlex.join(argv))}`.",
        f"# Submit with `sbatch {comment(shlex.quote(req.output or 'SCRIPT'))}`: one `ftune run` per node, the same recipe everywhere;",
        "# each node's rank and the main node's address come from Slurm's environment on that node.",
        f"# On preemption or the time limit Slurm sends SIGTERM {GRACE_S} s ahead: each worker saves a checkpoint and",
        "# exits; the requeued job resumes from the last complete checkpoint.",
        f"#SBATCH --job-name={r.name}",
        f"#SBATCH --nodes={req.nodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if gpus is not None:
        lines.append(f"#SBATCH --gpus-per-node={gpus}")
    if no_space("partition", req.partition, SBATCH_VALUE):
        lines.append(f"#SBATCH --partition={req.partition}")
    if no_space("time", req.time, SBATCH_VALUE):
        lines.append(f"#SBATCH --time={req.time}")
    lines += [
        "#SBATCH --requeue",
        f"#SBATCH --signal=TERM@{GRACE_S}",
        "#SBATCH --output=%x-%j.out",
        "set -euo pipefail",
        "",
        "# recipe, data and output paths are relative to the folder this script was written in",
        f"cd {shlex.quote(os.getcwd())}",
        "",
        "# machine 0: the first host of the allocation, the same for every node",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"MASTER_PORT=${{FTUNE_MAIN_PROCESS_PORT:-{port}}}",
        "export MASTER_ADDR MASTER_PORT",
        "",
        "# one task per node: each `ftune run` takes its rank (SLURM_NODEID) and the node count (SLURM_NNODES)",
        "# from its own environment",
        f"srun --nodes={req.nodes} --ntasks-per-node=1 ftune run {shlex.join([req.recipe, *overrides])}",
    ]
    return "\n".join(lines) + "\n"
