"""SkyPilot: a task YAML that runs one `ftune run` per node on `--nodes` machines with `--accelerators` each.

`workdir` syncs the folder the spec is written in (the recipe, relative data) to every node; data files named
by an absolute path are copied by `file_mounts`, and with `--bucket` the run dir lives in a mounted bucket so a
relaunched job resumes from the last complete checkpoint. The run command passes SkyPilot's node rank, node count
and node 0's address (the first of SKYPILOT_NODE_IPS) as the job keys. The recipe's secrets are declared
under `secrets` with no value: `sky launch --secret NAME` passes each one from the local environment.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from ftune import __version__
from ftune.errors import UsageError
from ftune.launch.jobs.common import comment, dump_yaml, DEFAULT_PORT, Request, check, no_space, secret_variables
from ftune.recipe.sources import sources

SUBMIT = "sky launch {file}"
RUNS = "/ftune-runs"
ACCELERATORS = re.compile(r"^[A-Za-z0-9_-]+(:[0-9]+)?$")

NODE_COMMAND = (
    'MAIN_IP=$(echo "$SKYPILOT_NODE_IPS" | head -n 1)\n'
    "exec ftune run {args} \\\n"
    '  "distributed.num_machines=$SKYPILOT_NUM_NODES" "distributed.machine_rank=$SKYPILOT_NODE_RANK" \\\n'
    '  "distributed.main_process_ip=$MAIN_IP" "distributed.main_process_port={port}"\n'
)


def _gpus(accelerators: str | None) -> int | None:
    if accelerators is None:
        return None
    if not ACCELERATORS.match(accelerators):
        raise UsageError(f"--accelerators {accelerators!r}: write NAME or NAME:COUNT, e.g. H100:8")
    return int(accelerators.partition(":")[2] or 1)


def task(req: Request) -> dict:
    no_space("bucket", req.bucket)
    gpus = _gpus(req.accelerators)
    if req.gpus_per_node is None and gpus is not None:
        req.gpus_per_node = gpus
    loaded, overrides, _ = check(req)
    r = loaded.recipe
    args = [req.recipe, *overrides]
    mounts: dict = {}
    for _, src in sources(r):
        path = getattr(src, "path", None)
        if src.type != "hub" and path and Path(path).is_absolute():
            mounts[path] = path
    if req.bucket:
        mounts[RUNS] = {"name": req.bucket, "mode": "MOUNT"}
        args.append(f"output.dir={RUNS}/{r.name}")
    spec: dict = {"name": re.sub(r"[^A-Za-z0-9._-]+", "-", r.name).strip("-") or "ftune", "num_nodes": req.nodes}
    if req.accelerators:
        spec["resources"] = {"accelerators": req.accelerators}
    spec["workdir"] = "."
    if mounts:
        spec["file_mounts"] = mounts
    secrets = secret_variables(loaded, "SkyPilot")
    if secrets:
        spec["secrets"] = {name: None for name in secrets}
    spec["setup"] = f"pip install {shlex.quote(req.install or f'ftune[train]=={__version__}')}\n"
    port = r.distributed.main_process_port or DEFAULT_PORT
    spec["run"] = NODE_COMMAND.format(args=shlex.join(args), port=port)
    return spec


def write(req: Request) -> str:
    spec = task(req)
    flags = "".join(f" --secret {name}" for name in spec.get("secrets", {}))
    head = [f"# Written by `ftune launch-script skypilot`: {req.nodes} node(s), one `ftune run` each.",
            comment(f"# Launch from this folder with `sky launch {shlex.quote(req.output or 'FILE')}{flags}`.")]
    if not req.bucket:
        head.append("# No --bucket: the run dir lives on node 0's disk (a relaunch on new machines starts over).")
    return "\n".join(head) + "\n" + dump_yaml(spec)
