"""`ftune launch-script TARGET RECIPE --nodes N [...] [-o FILE] [key=value ...]`: a job spec that runs one
`ftune run` per node, the same recipe everywhere.

Targets (`ftune.launch.jobs`): `slurm` (an sbatch script), `kubernetes` (a Kubeflow Trainer TrainJob), `skypilot`
(a task YAML). The recipe is loaded and validated for the multi-node job before anything is written.
"""

from __future__ import annotations

import argparse
import sys

from ftune.errors import EXIT_OK, UsageError

TARGETS = ("slurm", "kubernetes", "skypilot")  # ftune.launch.jobs.TARGETS, spelled here so --help imports nothing


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scheduler", choices=TARGETS, help="the scheduler to write a job spec for")
    parser.add_argument("recipe", metavar="RECIPE", help="recipe file, the same on every node")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides passed to every node's `ftune run`")
    parser.add_argument("--nodes", type=int, required=True, metavar="N", help="nodes (machines) in the job")
    parser.add_argument("--gpus-per-node", type=int, metavar="G",
                        help="GPUs per node (and distributed.num_processes); default: the recipe's num_processes "
                             "when it is a number (skypilot: the count in --accelerators)")
    slurm = parser.add_argument_group("slurm")
    slurm.add_argument("--partition", help="#SBATCH --partition")
    slurm.add_argument("--time", help="#SBATCH --time, e.g. 24:00:00")
    k8s = parser.add_argument_group("kubernetes")
    k8s.add_argument("--image", help="container image with ftune installed (required)")
    k8s.add_argument("--pvc", metavar="NAME", help="PersistentVolumeClaim holding the project folder and the run dir, "
                     "mounted on every node")
    k8s.add_argument("--runtime", default="torch-distributed", help="the ClusterTrainingRuntime to use "
                     "(default: torch-distributed)")
    k8s.add_argument("--secret-name", default="ftune-secrets", help="the Kubernetes Secret holding the recipe's "
                     "secret variables, one key each (default: ftune-secrets)")
    sky = parser.add_argument_group("skypilot")
    sky.add_argument("--accelerators", metavar="NAME:COUNT", help="accelerators per node, e.g. H100:8")
    sky.add_argument("--bucket", help="a storage bucket mounted for the run dir (resume after a relaunch)")
    sky.add_argument("--install", metavar="PIP_SPEC", help="what setup pip-installs (default: ftune[train]==<this "
                     "version>; `-e .` installs the synced folder)")
    parser.add_argument("-o", "--output", metavar="FILE", help="write the spec here (default: stdout)")
    parser.add_argument("--force", action="store_true", help="replace FILE if it is a spec launch-script wrote")


def _request(args: argparse.Namespace):
    from ftune.launch.jobs.common import Request

    if args.scheduler == "kubernetes" and not args.image:
        raise UsageError("kubernetes: --image is required (a container image with ftune installed)")
    return Request(target=args.scheduler, recipe=args.recipe, overrides=list(args.overrides), nodes=args.nodes,
                   gpus_per_node=args.gpus_per_node, output=args.output, partition=args.partition, time=args.time,
                   image=args.image, pvc=args.pvc, runtime=args.runtime, secret_name=args.secret_name,
                   accelerators=args.accelerators, bucket=args.bucket, install=args.install)


def write(args: argparse.Namespace, text: str, submit: str) -> int:
    """Every target's spec goes out here: to stdout, or to `-o FILE` through the output policy (never the
    recipe, a run dir or a model; replaced only with --force and only if launch-script wrote it), atomically."""
    from ftune import outputs
    from ftune.cli.console import write_stdout

    if args.output is None:
        write_stdout(text)
        return EXIT_OK
    out = outputs.check_output(args.output, outputs.SCRIPT, inputs=[args.recipe], force=args.force)
    outputs.write_text(out, text, mode=0o755 if args.scheduler == "slurm" else None)
    print(f"wrote {args.output}: {args.nodes} node(s); submit with `{submit}`", file=sys.stderr)
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    from ftune.launch.jobs import target

    if args.output is not None:  # refused before the recipe is even loaded
        from ftune import outputs

        outputs.check_output(args.output, outputs.SCRIPT, inputs=[args.recipe], force=args.force)
    module = target(args.scheduler)
    return write(args, module.write(_request(args)), module.SUBMIT.format(file=args.output))
