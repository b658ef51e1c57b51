"""Kubernetes: a Kubeflow Trainer v2 `TrainJob` that runs one `ftune run` per node.

The TrainJob names a `ClusterTrainingRuntime` (`torch-distributed` by default), whose torch plugin starts each
node's container with PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT:
`ftune run` maps them onto its launch (`ftune.plan.cluster`). With `--pvc`, a PersistentVolumeClaim is mounted
at MOUNT on every node (a runtime patch), the container starts there, and the run dir lives on it: a node that
restarts resumes from the last complete checkpoint. The pods get 120 s between SIGTERM and the kill, time for
each worker to save a checkpoint of its step. The recipe's secrets come from a Kubernetes Secret through
`valueFrom.secretKeyRef`, one key per variable; the spec never holds a value.
"""

from __future__ import annotations

import shlex

from ftune.launch.jobs.common import comment, dump_yaml, Request, check, dns_name, no_space, secret_variables

SUBMIT = "kubectl apply -f {file}"
API_VERSION = "trainer.kubeflow.org/v1alpha1"
MOUNT = "/workspace"
VOLUME = "ftune-work"
GRACE_S = 120
NODE = "node"
"""The replicated job and the trainer container of Kubeflow's torch runtimes."""


def trainjob(req: Request) -> dict:
    """The TrainJob as a dict (camelCase keys, as `kubectl` reads it)."""
    no_space("image", req.image)
    no_space("pvc", req.pvc)
    no_space("runtime", req.runtime)
    no_space("secret-name", req.secret_name)
    loaded, overrides, gpus = check(req)
    name = dns_name(loaded.recipe.name)
    argv = ["ftune", "run", req.recipe, *overrides]
    trainer: dict = {"image": req.image, "numNodes": req.nodes}
    if req.pvc:  # start in the project folder on the volume: the recipe's relative paths land there
        trainer["command"] = ["bash", "-c", f'cd {shlex.quote(MOUNT)} && exec "$@"', "ftune-node", *argv]
    else:
        trainer["command"] = argv
    if gpus is not None:
        trainer["numProcPerNode"] = gpus
        trainer["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    env = [{"name": var, "valueFrom": {"secretKeyRef": {"name": req.secret_name, "key": var}}}
           for var in secret_variables(loaded, "Kubernetes")]
    if env:
        trainer["env"] = env
    spec: dict = {"runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                 "name": req.runtime},
                  "trainer": trainer}
    # SIGTERM (preemption, eviction) gives each worker GRACE_S to save a checkpoint of its step (docs/safety.md)
    pod: dict = {"terminationGracePeriodSeconds": GRACE_S}
    if req.pvc:
        pod["volumes"] = [{"name": VOLUME, "persistentVolumeClaim": {"claimName": req.pvc}}]
        pod["containers"] = [{"name": NODE, "volumeMounts": [{"name": VOLUME, "mountPath": MOUNT}]}]
    job = {"name": NODE, "template": {"spec": {"template": {"spec": pod}}}}
    spec["runtimePatches"] = [{"manager": "ftune", "trainingRuntimeSpec": {
        "template": {"spec": {"replicatedJobs": [job]}}}}]
    return {"apiVersion": API_VERSION, "kind": "TrainJob", "metadata": {"name": name}, "spec": spec}


def write(req: Request) -> str:
    job = trainjob(req)
    secrets = [e["name"] for e in job["spec"]["trainer"].get("env", [])]
    head = [f"# Written by `ftune launch-script kubernetes`: {req.nodes} node(s), one `ftune run` each; ranks and",
            "# node 0's address come from the runtime's PET_* variables.",
            f"# Submit with `kubectl apply -f {comment(shlex.quote(req.output or 'FILE'))}`."]
    if secrets:
        head.append(comment(f"# Needs the Secret {req.secret_name} with the keys {', '.join(secrets)}: "
                            f"kubectl create secret generic {shlex.quote(req.secret_name)} "
                            + " ".join(f"--from-literal={s}=..." for s in secrets)))
    if not req.pvc:
        head.append("# No --pvc: the run dir lives in the container and is lost with it (no resume after a restart).")
    return "\n".join(head) + "\n" + dump_yaml(job)
