"""`ftune launch-script slurm RECIPE --nodes N [--gpus-per-node G] [-o FILE] [key=value ...]`: an sbatch script
that runs one `ftune run` per node, the same recipe everywhere.

Each node's rank and the main node's address come from Slurm's environment on that node
(`SLURM_NODEID`, `SLURM_NNODES`, the first host of `SLURM_JOB_NODELIST`), so they are expanded inside
the task `srun` starts, never in the batch script (which runs on the first node only). The recipe is
loaded and validated for the multi-node job before anything is written.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from ftune.errors import EXIT_OK, FtuneError, UsageError

DEFAULT_PORT = 29500
JOB_KEYS = ("distributed.num_machines", "distributed.machine_rank", "distributed.main_process_ip",
            "distributed.main_process_port")

# Runs on every node inside the srun task: "$@" is the recipe and its overrides, quoted once by the
# batch script; the Slurm variables are this node's own.
NODE_COMMAND = ('exec ftune run "$@" distributed.num_machines="$SLURM_NNODES" '
                'distributed.machine_rank="$SLURM_NODEID"')


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scheduler", choices=["slurm"], help="the scheduler to write a script for")
    parser.add_argument("recipe", metavar="RECIPE", help="recipe file, the same on every node")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides passed to every node's `ftune run`")
    parser.add_argument("--nodes", type=int, required=True, metavar="N", help="nodes (machines) in the job")
    parser.add_argument("--gpus-per-node", type=int, metavar="G",
                        help="GPUs per node (#SBATCH --gpus-per-node, and distributed.num_processes); "
                             "default: the recipe's num_processes when it is a number")
    parser.add_argument("--partition", help="#SBATCH --partition")
    parser.add_argument("--time", help="#SBATCH --time, e.g. 24:00:00")
    parser.add_argument("-o", "--output", metavar="FILE", help="write the script here (default: stdout)")
    parser.add_argument("--force", action="store_true", help="replace FILE if it is a script launch-script wrote")


def _check(args: argparse.Namespace):
    """Load the recipe as every node will (errors located, exit 1); returns (loaded, gpus per node)."""
    from ftune.recipe import load_recipe

    if args.nodes < 1:
        raise UsageError(f"--nodes must be at least 1 (got {args.nodes})")
    if args.gpus_per_node is not None and args.gpus_per_node < 1:
        raise UsageError(f"--gpus-per-node must be at least 1 (got {args.gpus_per_node})")
    taken = [o for o in args.overrides if o.partition("=")[0].lstrip("~") in JOB_KEYS]
    if taken:
        raise UsageError(f"{taken[0]}: the script sets {', '.join(JOB_KEYS)} from Slurm's environment on each node",
                         hint="leave these keys out of the overrides")
    overrides = list(args.overrides)
    if args.gpus_per_node is not None:
        overrides.append(f"distributed.num_processes={args.gpus_per_node}")
    loaded = load_recipe(args.recipe, overrides)
    d = loaded.recipe.distributed
    if d.strategy == "none":
        raise FtuneError(
            f"{args.recipe}: distributed.strategy is 'none' (one process), so there is nothing to spread over "
            f"{args.nodes} node{'s' if args.nodes != 1 else ''}",
            hint="set `distributed.strategy: ddp` (or fsdp / deepspeed) in the recipe, or pass "
                 "distributed.strategy=fsdp after the recipe",
            location=loaded.locate("distributed.strategy"),
        )
    # the job's shape, checked once as node 0 will see it (machine_rank < num_machines, an address, ...)
    load_recipe(args.recipe, [*overrides, f"distributed.num_machines={args.nodes}", "distributed.machine_rank=0",
                              "distributed.main_process_ip=node0"])
    gpus = args.gpus_per_node
    if gpus is None and isinstance(d.num_processes, int) and d.num_processes > 1:
        gpus = d.num_processes
    return loaded, overrides, gpus


def _one_line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n")


def _sbatch_value(flag: str, value: str | None) -> str | None:
    if value is not None and (not value or any(c.isspace() for c in value)):
        raise UsageError(f"--{flag} {value!r}: an #SBATCH value can't be empty or contain spaces")
    return value


def script(args: argparse.Namespace) -> str:
    loaded, overrides, gpus = _check(args)
    r = loaded.recipe
    port = r.distributed.main_process_port or DEFAULT_PORT
    argv = ["ftune", "launch-script", "slurm", args.recipe, f"--nodes={args.nodes}"]
    if args.gpus_per_node is not None:
        argv.append(f"--gpus-per-node={args.gpus_per_node}")
    argv += args.overrides
    lines = [
        "#!/bin/bash",
        f"# Written by `{_one_line(shlex.join(argv))}`.",
        f"# Submit with `sbatch {args.output or 'SCRIPT'}`: one `ftune run` per node, the same recipe everywhere;",
        "# each node's rank and the main node's address come from Slurm's environment on that node.",
        f"#SBATCH --job-name={r.name}",
        f"#SBATCH --nodes={args.nodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if gpus is not None:
        lines.append(f"#SBATCH --gpus-per-node={gpus}")
    if _sbatch_value("partition", args.partition):
        lines.append(f"#SBATCH --partition={args.partition}")
    if _sbatch_value("time", args.time):
        lines.append(f"#SBATCH --time={args.time}")
    lines += [
        "#SBATCH --output=%x-%j.out",
        "set -euo pipefail",
        "",
        "# recipe, data and output paths are relative to the folder this script was written in",
        f"cd {shlex.quote(os.getcwd())}",
        "",
        "# machine 0: the first host of the allocation, the same for every node",
        'MAIN_PROCESS_IP=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"MAIN_PROCESS_PORT=${{FTUNE_MAIN_PROCESS_PORT:-{port}}}",
        "",
        "# one task per node; single quotes keep $SLURM_NODEID for the node's own shell to expand",
        f"srun --nodes={args.nodes} --ntasks-per-node=1 bash -c {shlex.quote(NODE_COMMAND)} ftune-node \\",
        f"    {shlex.join([args.recipe, *overrides])} \\",
        '    "distributed.main_process_ip=$MAIN_PROCESS_IP" "distributed.main_process_port=$MAIN_PROCESS_PORT"',
    ]
    return "\n".join(lines) + "\n"


def write(args: argparse.Namespace, text: str, submit: str) -> int:
    """Every target's script goes out here: to stdout, or to `-o FILE` through the output policy (never the
    recipe, a run dir or a model; replaced only with --force and only if launch-script wrote it), atomically."""
    from ftune import outputs
    from ftune.cli.console import write_stdout

    if args.output is None:
        write_stdout(text)
        return EXIT_OK
    out = outputs.check_output(args.output, outputs.SCRIPT, inputs=[args.recipe], force=args.force)
    outputs.write_text(out, text, mode=0o755)
    print(f"wrote {args.output}: {args.nodes} node(s); submit with `{submit} {args.output}`", file=sys.stderr)
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    if args.output is not None:  # refused before the recipe is even loaded
        from ftune import outputs

        outputs.check_output(args.output, outputs.SCRIPT, inputs=[args.recipe], force=args.force)
    return write(args, script(args), "sbatch")
