"""What every job spec needs: the request from the command line, and the recipe checked as every node will load it.

Each node runs `ftune run RECIPE` with the scheduler's variables (`ftune.plan.cluster` maps them onto the
launch), so the spec never writes a node's rank or address itself unless the scheduler gives it no variable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ftune.errors import FtuneError, UsageError
from ftune.recipe.schema import MAX_NODES, MAX_PROCESSES_PER_NODE

JOB_KEYS = ("distributed.num_machines", "distributed.machine_rank", "distributed.main_process_ip",
            "distributed.main_process_port")
GENERATED_SECRET = "FTUNE_SECRET_"
DEFAULT_PORT = 29500


@dataclass
class Request:
    """`ftune launch-script TARGET RECIPE ...` as given."""

    target: str
    recipe: str
    overrides: list[str] = field(default_factory=list)
    nodes: int = 1
    gpus_per_node: int | None = None
    output: str | None = None
    partition: str | None = None
    time: str | None = None
    image: str | None = None
    pvc: str | None = None
    runtime: str = "torch-distributed"
    secret_name: str = "ftune-secrets"
    accelerators: str | None = None
    bucket: str | None = None
    install: str | None = None


def dump_yaml(data: dict) -> str:
    """YAML as a person reads it: keys in the spec's order, multi-line strings (scripts) as `|` blocks."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value: str):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    Dumper.add_representer(str, text)
    return yaml.dump(data, Dumper=Dumper, sort_keys=False)


SBATCH_VALUE = re.compile(r"^[A-Za-z0-9._:,+@%=/-]+$")
"""What a value pasted into an `#SBATCH --key=value` line may hold: sbatch reads the line itself."""


def no_space(flag: str, value: str | None, allowed: re.Pattern | None = None) -> str | None:
    """A value that lands in a spec verbatim: non-empty, no whitespace or other unprintable character (a line
    break would start a new line of the spec), and, where given, only the characters `allowed`."""
    if value is None:
        return None
    if not value or any(c.isspace() or not c.isprintable() for c in value):
        raise UsageError(f"--{flag} {value!r}: it can't be empty or contain whitespace or control characters")
    if allowed is not None and not allowed.match(value):
        raise UsageError(f"--{flag} {value!r}: only letters, digits and . _ : , + @ % = / - are allowed here")
    return value


def comment(text: str) -> str:
    """`text` for a one-line `#` comment of a script or a YAML file: each unprintable character written as its
    escape (newline, carriage return, YAML's other line breaks U+0085, U+2028, U+2029, tabs, ...), so nothing in
    it can start a line of its own (a shell command in sbatch, a key in YAML)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def dns_name(text: str) -> str:
    """A Kubernetes object name (RFC 1123 label, 63 characters) from a recipe name."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:63].rstrip("-")
    return name or "ftune"


def check(req: Request):
    """Load the recipe as every node will (errors located, exit 1); returns (loaded, overrides, gpus per node)."""
    from ftune.recipe import load_recipe

    for flag, value, most in (("nodes", req.nodes, MAX_NODES), ("gpus-per-node", req.gpus_per_node,
                                                                MAX_PROCESSES_PER_NODE)):
        if value is not None and value < 1:
            raise UsageError(f"--{flag} must be at least 1 (got {value})")
        if value is not None and value > most:
            raise UsageError(f"--{flag} must be at most {most} (got {value})")
    taken = [o for o in req.overrides if o.partition("=")[0].lstrip("~") in JOB_KEYS]
    if taken:
        raise UsageError(f"{taken[0]}: each node takes {', '.join(JOB_KEYS)} from the scheduler's environment",
                         hint="leave these keys out of the overrides")
    overrides = list(req.overrides)
    if req.gpus_per_node is not None:
        overrides.append(f"distributed.num_processes={req.gpus_per_node}")
    loaded = load_recipe(req.recipe, overrides)
    d = loaded.recipe.distributed
    if d.strategy == "none" and req.nodes > 1:
        raise FtuneError(
            f"{req.recipe}: distributed.strategy is 'none' (one process), so there is nothing to spread over "
            f"{req.nodes} nodes",
            hint="set `distributed.strategy: ddp` (or fsdp / deepspeed) in the recipe, or pass "
                 "distributed.strategy=fsdp after the recipe",
            location=loaded.locate("distributed.strategy"),
        )
    gpus = req.gpus_per_node
    if gpus is None and isinstance(d.num_processes, int) and d.num_processes > 1:
        gpus = d.num_processes
    # the recipe tier of the checks (`ftune.plan.checks`) on the job's shape as node 0 will see it: the flags'
    # nodes x GPUs against the N-D sizes, machine_rank < num_machines, ... (the address comes from the scheduler)
    from ftune.plan import checks
    from ftune.recipe import rules

    node0 = d.model_copy(update={"num_machines": req.nodes, "machine_rank": 0, "main_process_ip": "node0"})
    recipe = loaded.recipe.model_copy(update={"distributed": node0})
    job = checks.Job(recipe, Path(loaded.file).parent, world_size=checks.world_size(node0, gpus))
    # the rules again on that shape (one that reads the machines, e.g. grpo's whole generation groups), then the table
    if found := rules.check(recipe) + checks.problems(job, checks.COMMANDS["launch-script"]):
        raise loaded.error(found)
    return loaded, overrides, gpus


def secret_variables(loaded, where: str) -> list[str]:
    """The environment variables the recipe reads its secrets from (`hub_token: ${env:HF_TOKEN}`), for the spec to
    pass from the scheduler's secret store. A secret written into the recipe or an override is refused: a job
    spec is shared and kept, so it would carry the secret in clear."""
    literal = sorted(path for path, var in loaded.secrets.items() if var.startswith(GENERATED_SECRET))
    if literal:
        raise FtuneError(
            f"{literal[0]}: a secret is written in the recipe (or an override); a {where} spec would carry it in "
            "clear",
            hint=f"write `{literal[0].rsplit('.', 1)[-1]}: ${{env:HF_TOKEN}}` (any variable name) and keep the value "
                 "in the scheduler's secret store",
            location=loaded.locate(literal[0]))
    return sorted({var for var in loaded.secrets.values()})
