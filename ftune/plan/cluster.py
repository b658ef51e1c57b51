"""The job's shape from the launcher that started `ftune run`: torchrun, Kubeflow Trainer (`PET_*`), MPI or Slurm.

A scheduler starts one `ftune run` per node and tells it, through its environment, how many nodes there are,
which one this is and where node 0 listens. `detect(environ)` reads those variables (one launcher, the
innermost), and `apply` maps them onto `distributed.*` for the compiler, which decides the accelerate launch
from them as from the recipe. Each value remembers the variable it came from (`Plan.cluster.sources`).

Rules, each a located problem at the recipe key and naming the variable:
- a launcher is found but a variable it must set is missing, not a whole number in its range (a port 1-65535,
  counts 1 to MAX_NODES / MAX_PROCESSES_PER_NODE), an address that is no host name or IP, a Slurm node list that
  doesn't parse, or they contradict each other (a node rank past the node count, a world size that isn't nodes x
  processes);
- the recipe sets a key explicitly to another value than the environment says;
- the launcher started several `ftune run` per node (ftune starts the per-node processes itself);
- the environment describes several processes but `distributed.strategy` is `none`.

Light module: no torch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict

from ftune.errors import Problem
from ftune.recipe.schema import MAX_NODES, MAX_PROCESSES_PER_NODE

Launcher = Literal["torchrun", "kubeflow", "mpi", "slurm"]
MAX_PORT = 65_535
HOST_LABEL = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")
NODELIST = re.compile(r"^[A-Za-z0-9._-]*(\[\d+(-\d+)?(,\d+(-\d+)?)*\][A-Za-z0-9._-]*)*$")
"""One item of a Slurm host list: `gpu07`, `gpu[07-09,12]`, `rack[1-2]-node[01-04]`."""
DEFAULT_PORT = 29500
TORCHRUN_PORT_SHIFT = 1
"""Under torchrun, its agent's rendezvous store listens on MASTER_PORT: ftune's own launch uses the next port."""

DESCRIBE = {"torchrun": "torchrun", "kubeflow": "Kubeflow Trainer (PET_*)", "mpi": "Open MPI (OMPI_*)",
            "slurm": "Slurm (SLURM_*)"}
TORCHRUN_WORDS = ("auto", "gpu", "cpu", "xpu")
"""The words torchrun takes as --nproc-per-node (the per-node count it then finds itself)."""
KEYS = ("num_machines", "machine_rank", "num_processes", "main_process_ip", "main_process_port")


class ClusterEnv(BaseModel):
    """What the launcher's environment says about the job; recorded in plan.json as `cluster`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    launcher: Launcher
    num_machines: int
    machine_rank: int
    num_processes: int | None = None
    """Processes per node, when the launcher says (Kubeflow's PET_NPROC_PER_NODE); else the recipe's."""
    main_process_ip: str | None = None
    main_process_port: int | None = None
    sources: dict[str, str] = {}
    """Recipe key (`distributed.num_machines`) -> where its value came from (`PET_NNODES=2`)."""


class _Reader:
    """Reads one launcher's variables, collecting problems located at the recipe key each one feeds."""

    def __init__(self, environ: Mapping[str, str], launcher: Launcher):
        self.env, self.launcher = environ, launcher
        self.values: dict[str, object] = {}
        self.sources: dict[str, str] = {}
        self.problems: list[Problem] = []

    def _hint(self) -> str:
        return f"the job's {DESCRIBE[self.launcher]} environment must set it; check the job spec"

    def text(self, key: str, *names: str, required: bool = True) -> str | None:
        for name in names:
            value = self.env.get(name, "").strip()
            if value:
                self.values[key] = value
                self.sources[f"distributed.{key}"] = f"{name}={value}"
                return value
        if required:
            self.problems.append(Problem.at(f"distributed.{key}", f"{DESCRIBE[self.launcher]} job: {' or '.join(names)} "
                                            "is missing or empty", self._hint()))
        return None

    def number(self, key: str, *names: str, required: bool = True, least: int = 0,
               most: int | None = None) -> int | None:
        """A whole number in [least, most], written in ASCII digits (no sign, `_`, exponent or other script's
        digits, which int() would take); `most` defaults to the key's bound (`BOUNDS`)."""
        value = self.text(key, *names, required=required)
        if value is None:
            return None
        most = BOUNDS.get(key) if most is None else most
        name = self.sources[f"distributed.{key}"].partition("=")[0]
        n = int(value) if value.isascii() and value.isdigit() and len(value) <= 12 else None
        if n is None or n < least or (most is not None and n > most):
            self.drop(key)
            limits = f"from {least} to {most}" if most is not None else f">= {least}"
            self.problems.append(Problem.at(f"distributed.{key}", f"{DESCRIBE[self.launcher]} job: {name}={value!r} is "
                                            f"not a whole number {limits}", self._hint()))
            return None
        self.values[key] = n
        return n

    def address(self, *names: str, required: bool = True) -> str | None:
        """Node 0's address: a host name (RFC 1123 labels; `_` tolerated) or an IPv4/IPv6 address."""
        value = self.text("main_process_ip", *names, required=required)
        if value is None or is_address(value):
            return value
        name = self.sources["distributed.main_process_ip"].partition("=")[0]
        self.drop("main_process_ip")
        self.fail("main_process_ip", f"{name}={value!r} is not a host name or an IP address")
        return None

    def drop(self, key: str) -> None:
        self.values.pop(key, None)
        self.sources.pop(f"distributed.{key}", None)

    def fail(self, key: str, message: str, hint: str | None = None) -> None:
        self.problems.append(Problem.at(f"distributed.{key}", f"{DESCRIBE[self.launcher]} job: {message}",
                                        hint or self._hint()))


BOUNDS = {"num_machines": MAX_NODES, "num_processes": MAX_PROCESSES_PER_NODE, "main_process_port": MAX_PORT,
          "machine_rank": MAX_NODES - 1}


def is_address(text: str) -> bool:
    """A host name (RFC 1123: dot-separated labels of letters, digits, `-`; `_` tolerated) or an IP address."""
    import ipaddress

    try:
        ipaddress.ip_address(text.removeprefix("[").removesuffix("]"))
        return True
    except ValueError:
        pass
    return len(text) <= 253 and all(HOST_LABEL.match(label) for label in text.removesuffix(".").split("."))


def _items(nodelist: str) -> list[str]:
    """A host list's items, split at the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(nodelist):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            items.append(nodelist[start:i])
            start = i + 1
    return [*items, nodelist[start:]]


def first_host(nodelist: str) -> str | None:
    """The first host of a Slurm host list: `gpu[07-09,12],cpu1` -> `gpu07` (`scontrol show hostnames | head -1`);
    None when the list doesn't parse (an unclosed bracket, a range backwards, a character no host name has)."""
    items = _items(nodelist.strip())
    if not all(item and NODELIST.match(item) for item in items):
        return None
    for ranges in re.findall(r"\[([^\]]*)\]", items[0]):
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if hi and (int(hi) < int(lo) or len(hi) != len(lo) and lo.startswith("0")):
                return None
    host = re.sub(r"\[([^\],-]*)[^\]]*\]", r"\1", items[0])
    return host if is_address(host) else None


def _one_per_node(r: _Reader, name: str, per_node: int | None) -> None:
    if per_node is not None and per_node != 1:
        r.fail("num_processes", f"{name}={per_node}: the launcher started {per_node} copies of `ftune run` on this "
               "node", "start ftune once per node (it starts distributed.num_processes processes on each node "
               "itself), e.g. torchrun --nproc-per-node 1, srun --ntasks-per-node=1, mpirun -npernode 1")


def _torchrun(r: _Reader) -> None:
    world = r.number("num_machines", "WORLD_SIZE", least=1)
    rank = r.number("machine_rank", "GROUP_RANK", "RANK")
    local = r.env.get("LOCAL_WORLD_SIZE", "1").strip()
    _one_per_node(r, "LOCAL_WORLD_SIZE", int(local) if local.isascii() and local.isdigit() else None)
    r.address("MASTER_ADDR")
    port = r.number("main_process_port", "MASTER_PORT", least=1,
                    most=MAX_PORT - TORCHRUN_PORT_SHIFT if r.env.get("TORCHELASTIC_RUN_ID") else MAX_PORT)
    if port is not None and r.env.get("TORCHELASTIC_RUN_ID"):
        r.values["main_process_port"] = port + TORCHRUN_PORT_SHIFT
        r.sources["distributed.main_process_port"] += (f" + {TORCHRUN_PORT_SHIFT} (torchrun's own rendezvous store "
                                                       "listens on MASTER_PORT)")
    if world is not None and rank is not None and rank >= world:
        r.fail("machine_rank", f"RANK={rank} is out of range for WORLD_SIZE={world}")


def _kubeflow(r: _Reader) -> None:
    nodes = r.text("num_machines", "PET_NNODES")
    if nodes is not None and ":" in nodes:
        r.values.pop("num_machines")
        r.fail("num_machines", f"PET_NNODES={nodes}: an elastic node range is not supported",
               "give the TrainJob a fixed numNodes")
    elif nodes is not None:
        r.number("num_machines", "PET_NNODES", least=1)
    per_node = r.text("num_processes", "PET_NPROC_PER_NODE")
    if per_node in TORCHRUN_WORDS:
        # torchrun's `auto`/`gpu`/`cpu`: the recipe's num_processes (`auto` = the visible GPUs) decides
        r.drop("num_processes")
    elif per_node is not None:
        r.number("num_processes", "PET_NPROC_PER_NODE", least=1)
    rank = r.number("machine_rank", "PET_NODE_RANK")
    r.address("PET_MASTER_ADDR")
    r.number("main_process_port", "PET_MASTER_PORT", least=1)
    world = r.values.get("num_machines")
    if isinstance(world, int) and rank is not None and rank >= world:
        r.fail("machine_rank", f"PET_NODE_RANK={rank} is out of range for PET_NNODES={world}")


def _mpi(r: _Reader) -> None:
    world = r.number("num_machines", "OMPI_COMM_WORLD_SIZE", least=1)
    rank = r.number("machine_rank", "OMPI_COMM_WORLD_RANK")
    local = r.env.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1").strip()
    _one_per_node(r, "OMPI_COMM_WORLD_LOCAL_SIZE", int(local) if local.isascii() and local.isdigit() else None)
    r.address("MASTER_ADDR")  # MPI names no address: the job script exports node 0's
    r.number("main_process_port", "MASTER_PORT", least=1, required=False)
    if world is not None and rank is not None and rank >= world:
        r.fail("machine_rank", f"OMPI_COMM_WORLD_RANK={rank} is out of range for OMPI_COMM_WORLD_SIZE={world}")


def _slurm(r: _Reader) -> None:
    nodes = r.number("num_machines", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", least=1)
    rank = r.number("machine_rank", "SLURM_NODEID")
    per_node = r.env.get("SLURM_NTASKS_PER_NODE", "").strip()
    _one_per_node(r, "SLURM_NTASKS_PER_NODE", int(per_node) if per_node.isascii() and per_node.isdigit() else None)
    tasks = r.env.get("SLURM_NTASKS", "").strip()
    if tasks.isascii() and tasks.isdigit() and nodes is not None and int(tasks) != nodes and not per_node:
        r.fail("num_processes", f"SLURM_NTASKS={tasks} tasks for SLURM_JOB_NUM_NODES={nodes} nodes",
               "start ftune once per node: srun --ntasks-per-node=1 (or #SBATCH --ntasks-per-node=1)")
    if "MASTER_ADDR" in r.env and r.env["MASTER_ADDR"].strip():
        r.address("MASTER_ADDR")
    else:
        nodelist = r.text("main_process_ip", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
        host = first_host(nodelist) if nodelist is not None else None
        if nodelist is not None and host is None:
            name = r.sources["distributed.main_process_ip"].partition("=")[0]
            r.drop("main_process_ip")
            r.fail("main_process_ip", f"{name}={nodelist!r} is not a Slurm host list",
                   "Slurm writes it as host names and bracketed ranges (gpu[07-09,12],cpu1); export MASTER_ADDR "
                   "to name node 0 yourself")
        elif host is not None:
            r.values["main_process_ip"] = host
            r.sources["distributed.main_process_ip"] += f" (first host: {host})"
    r.number("main_process_port", "MASTER_PORT", least=1, required=False)
    if nodes is not None and rank is not None and rank >= nodes:
        r.fail("machine_rank", f"SLURM_NODEID={rank} is out of range for SLURM_JOB_NUM_NODES={nodes}")


READERS = {"torchrun": _torchrun, "kubeflow": _kubeflow, "mpi": _mpi, "slurm": _slurm}
PET = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")


def which(environ: Mapping[str, str]) -> Launcher | None:
    """The innermost launcher whose variables are set (torchrun inside a Kubeflow pod is torchrun)."""
    if environ.get("TORCHELASTIC_RUN_ID"):
        return "torchrun"
    if any(name in environ for name in PET):
        return "kubeflow"
    if "WORLD_SIZE" in environ or "RANK" in environ:
        return "torchrun"
    if "OMPI_COMM_WORLD_SIZE" in environ or "OMPI_COMM_WORLD_RANK" in environ:
        return "mpi"
    if "SLURM_NODEID" in environ or "SLURM_JOB_NUM_NODES" in environ:
        return "slurm"
    return None


def detect(environ: Mapping[str, str]) -> tuple[ClusterEnv | None, list[Problem]]:
    """The launcher's view of the job, or None outside any launcher; problems for missing/contradictory variables."""
    launcher = which(environ)
    if launcher is None:
        return None, []
    r = _Reader(environ, launcher)
    READERS[launcher](r)
    if r.problems:
        return None, r.problems
    values = {k: v for k, v in r.values.items() if k in KEYS}
    return ClusterEnv(launcher=launcher, sources=r.sources, **values), []


def apply(distributed, cluster: ClusterEnv) -> tuple[object, list[Problem], list[str]]:
    """`distributed` with the launcher's values; problems where the recipe sets a key to something else.

    A key the recipe sets explicitly must agree; an unset key takes the environment's value."""
    problems: list[Problem] = []
    update: dict[str, object] = {}
    explicit = distributed.model_fields_set
    for key in KEYS:
        value = getattr(cluster, key)
        if value is None:
            continue
        if cluster.num_machines == 1 and key in ("main_process_ip", "main_process_port"):
            continue  # one node: nothing to find; a free local port avoids collisions
        ours = getattr(distributed, key)
        if key in explicit and ours != value and not (key == "num_processes" and ours == "auto"):
            problems.append(Problem.at(
                f"distributed.{key}", f"the recipe says distributed.{key}: {ours}, but the {DESCRIBE[cluster.launcher]}"
                f" environment says {cluster.sources[f'distributed.{key}']}",
                f"remove distributed.{key} from the recipe (the launcher sets it), or make the job spec agree"))
        update[key] = value
    per_node = update.get("num_processes", distributed.num_processes)
    several = cluster.num_machines > 1 or (isinstance(per_node, int) and per_node > 1)
    if several and distributed.strategy == "none":
        problems.append(Problem.at(
            "distributed.strategy", f"the {DESCRIBE[cluster.launcher]} environment describes a job of "
            f"{cluster.num_machines} node(s) x {per_node} process(es), but distributed.strategy is 'none' (one "
            "process)", "set `distributed.strategy: ddp` (or fsdp / deepspeed) for a multi-node job"))
    notes = [f"{DESCRIBE[cluster.launcher]}: " + ", ".join(f"{k.removeprefix('distributed.')} from {v}"
                                                           for k, v in cluster.sources.items())]
    return distributed.model_copy(update=update), problems, notes
