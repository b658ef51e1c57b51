"""Distributed set-up on the worker, before TrainingArguments exist.

The distributed TrainingArguments are compiled into `plan.trainer` from the same accelerate config the
launcher writes (ftune.plan.trainer). What is left for run time is `prepare`: the CPU FSDP shim and the FSDP v1
adapter names fix below, the only places ftune patches a library.
"""

from __future__ import annotations

_SHIM_APPLIED = False


# ------------------------------------------------------------------------------ CPU FSDP shim
def apply_cpu_fsdp_shim() -> None:
    """Make FSDP work on CPU processes (gloo). Applied only when CUDA is absent; idempotent.

    Measured with accelerate 1.15 / torch 2.13, each patch fixes one silent or fatal failure:
    1. accelerate's state ignores an FSDP plugin on MULTI_CPU and trains plain DDP: promote it to FSDP.
    2. FSDP v1 with `device_id=cpu:N` fails its compute-device check ('cpu vs cpu:0'): treat a CPU
       device_id as none (the parameters already live on the CPU).
    3. FSDP v1's full state dict 'moves' the unsharded flat parameter to CPU, then frees its storage,
       which is the same storage on CPU: a segfault. Skip that move when it is already on CPU.
    """
    global _SHIM_APPLIED
    if _SHIM_APPLIED:
        return
    import contextlib

    import torch.distributed.fsdp._init_utils as fsdp_init
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType
    from torch.distributed.fsdp._flat_param import FlatParamHandle

    state_init = AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        state_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            self.distributed_type = DistributedType.FSDP
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP  # later states copy it

    device_from_id = fsdp_init._get_device_from_device_id

    def get_device(device_id, rank, device_handle):
        device = device_from_id(device_id, rank, device_handle)
        return None if device is not None and device.type == "cpu" else device

    to_cpu = FlatParamHandle.to_cpu

    def to_cpu_unless_there(self):
        return contextlib.nullcontext() if self.flat_param.device.type == "cpu" else to_cpu(self)

    AcceleratorState.__init__ = init
    fsdp_init._get_device_from_device_id = get_device
    FlatParamHandle.to_cpu = to_cpu_unless_there
    _SHIM_APPLIED = True


# ------------------------------------------------------------------------------ FSDP v1 adapter names
FSDP_WRAPPERS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")
_NAMES_FIX_APPLIED = False


def apply_fsdp1_adapter_names_fix() -> None:
    """Let peft find adapter tensors under FSDP v1 (peft 0.21, accelerate 1.15; measured on 2 CPU processes).

    peft selects an adapter's tensors from a state dict by key prefixes it collects from `named_modules()`.
    Under FSDP v1 those names run through `_fsdp_wrapped_module.`, while FSDP's state dicts (sharded and full)
    carry clean names, so peft selected nothing: checkpoints held no adapter tensor, resuming restored nothing,
    and `final/` was empty. The prefixes peft collects are returned with the wrapper segments removed as well,
    so saving and loading (the Trainer's checkpoints through accelerate, ftune's final save) match either form.
    """
    global _NAMES_FIX_APPLIED
    if _NAMES_FIX_APPLIED:
        return
    from peft.tuners import tuners_utils

    collect = tuners_utils._get_tuner_state_dict_key_prefixes

    def prefixes(model, adapter_name=None):
        found = collect(model, adapter_name)
        clean = set()
        for prefix in found:
            for wrapper in FSDP_WRAPPERS:
                prefix = prefix.replace(wrapper, "")
            clean.add(prefix)
        return set(found) | clean

    tuners_utils._get_tuner_state_dict_key_prefixes = prefixes
    _NAMES_FIX_APPLIED = True


def apply_cpu_parallelism_shim() -> None:
    """Let accelerate's ParallelismConfig accept CPU processes (gloo). On CPU accelerate's state is MULTI_CPU,
    which `ParallelismConfig._validate_accelerator` rejects by name only: the device mesh it builds, the tensor-
    parallel path (no DDP around a DTensor model) and the rest work on gloo (measured: tp 2 gives the losses of
    one process). Validated as the multi-GPU type it stands for; idempotent."""
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import DistributedType

    validate = ParallelismConfig._validate_accelerator
    if getattr(validate, "_ftune_cpu", False):
        return

    def on_cpu(self, accelerator):
        state = accelerator.state
        if state.distributed_type != DistributedType.MULTI_CPU:
            return validate(self, accelerator)
        state.distributed_type = DistributedType.MULTI_GPU
        try:
            return validate(self, accelerator)
        finally:
            state.distributed_type = DistributedType.MULTI_CPU

    on_cpu._ftune_cpu = True
    ParallelismConfig._validate_accelerator = on_cpu


def prepare(plan) -> None:
    """Called by the worker before TrainingArguments/the Trainer exist."""
    d = plan.recipe.distributed
    if d.strategy == "fsdp" and d.fsdp is not None and d.fsdp.version == 1 and plan.recipe.peft.uses_peft_library:
        apply_fsdp1_adapter_names_fix()
    if plan.device != "cpu":
        return
    import warnings

    import torch

    if torch.cuda.is_available():
        return
    if plan.parallelism is not None and plan.parallelism.total > 1:
        apply_cpu_parallelism_shim()
    if plan.recipe.distributed.strategy != "fsdp":
        return
    warnings.filterwarnings("ignore", message=".*Module is put on CPU.*")
    apply_cpu_fsdp_shim()


DEFAULT_TIMEOUT_S = 1800
"""transformers' `ddp_timeout` when `distributed.timeout` is unset."""


def collective_timeout(plan) -> int:
    """Seconds a collective waits for the other ranks (`distributed.timeout`, else transformers' default)."""
    return plan.recipe.distributed.timeout or DEFAULT_TIMEOUT_S


def close(plan) -> None:
    """End a finished run's process group in order: every rank meets at a barrier, then destroys the group before
    the interpreter exits (left to the exit, gloo's threads can be torn down while still joinable). Without the
    barrier a rank that finished first destroyed its group while a peer still worked (rank 0 saving, writing the
    card and report); seen in CI as node 1 of the 2-node test aborting at teardown with "terminate called without
    an active exception" (exit -6) on gloo, which the launcher reports as a failed run. The barrier waits at most
    `distributed.timeout` (1800 s by default), like every collective of the run; when it fails (a peer gone after
    finishing), the group is destroyed all the same: this rank's work is complete."""
    import sys
    from datetime import timedelta

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        if dist.get_world_size() > 1:
            if dist.get_backend() == "gloo":  # names a rank that doesn't arrive; nccl has the group's own timeout
                dist.monitored_barrier(timeout=timedelta(seconds=collective_timeout(plan)))
            else:
                dist.barrier()
    except Exception as err:  # noqa: BLE001 - the run is complete; only the goodbye failed
        print(f"ftune worker: note: not every rank reached the end of the run together ({str(err).splitlines()[0][:160]})",
              file=sys.stderr)
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------ the world that formed
def check_world(plan, world_size: int) -> None:
    """Stop when the world that formed is not the one the plan promised: a launcher whose variables were lost
    on the way would otherwise train each node alone, on its own copy of the data."""
    if world_size == plan.world_size:
        return
    from ftune.errors import FtuneError

    where = ""
    if plan.cluster is not None:
        where = f" ({', '.join(v for k, v in plan.cluster.sources.items() if k != 'distributed.main_process_ip')})"
    raise FtuneError(f"this process joined a world of {world_size} process(es), but the plan promised "
                     f"{plan.world_size}{where}",
                     hint="check that every node was started with the same job variables and that the launcher "
                          "passes them to `ftune run`")


# ------------------------------------------------------------------------------ a peer that stopped
PEER_GONE = ("connection closed by peer", "connection reset by peer", "broken pipe", "socket closed",
             "nccl communicator was aborted", "ncclremoteerror", "connection refused", "timed out",
             "timeout", "watchdog caught collective operation timeout")
_HOSTS: list[str] = []
"""Each rank's host name, gathered once the process group exists (for the message when a peer stops)."""


def record_hosts(plan) -> None:
    """Every rank's host, gathered once at start (one tiny collective), so a failure can name where a peer ran; with
    it each rank's batch split (`split`), which every rank's plan must agree on."""
    import socket

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return
    hosts: list = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, (socket.gethostname(), split(plan)))
    _HOSTS[:] = [str(h) for h, _ in hosts]
    check_splits(hosts)


def split(plan) -> tuple[int, int, bool]:
    """Rows per device, accumulation and checkpointing as this machine's plan decided them."""
    t = plan.trainer
    return (t["per_device_train_batch_size"], t["gradient_accumulation_steps"],
            bool(t.get("activation_checkpointing")) or plan.activation_checkpointing == "fsdp")


def check_splits(splits: list[tuple[str, tuple[int, int, bool]]]) -> None:
    """Each machine compiles its own plan; `auto` sizes the micro-batch from that machine's memory, so machines with
    unlike memory could split the batch differently and then wait on each other's gradient syncs forever."""
    if len({s for _, s in splits}) <= 1:
        return
    seen: dict[tuple, list[str]] = {}
    for host, s in splits:
        if host not in (hosts := seen.setdefault(s, [])):
            hosts.append(host)
    said = "; ".join(f"{', '.join(hosts)}: {b} row(s) x {a} accumulation, checkpointing {'on' if c else 'off'}"
                     for (b, a, c), hosts in seen.items())
    from ftune.errors import FtuneError

    raise FtuneError(f"the machines' plans split the batch differently ({said}): the ranks would wait on each "
                     "other's gradient syncs",
                     hint="train.per_device_batch_size / gradient_checkpointing `auto` decide on each machine's "
                          "memory: set them to numbers for machines with unlike memory (`ftune plan --gpu-memory` "
                          "says what fits)")


def peer_stopped(err: BaseException, plan) -> Exception | None:
    """A collective that failed because another rank stopped (killed, crashed, a node lost) or stopped answering
    within `distributed.timeout`: a located FtuneError naming the rank(s) and host(s), else None."""
    import re

    text = f"{type(err).__name__}: {err}".lower()
    if plan.world_size < 2 or not any(words in text for words in PEER_GONE):
        return None
    import torch.distributed as dist

    if type(err).__name__ not in ("DistBackendError", "DistNetworkError", "DistStoreError", "RuntimeError",
                                  "DistError", "ConnectionError", "TimeoutError"):
        return None
    from ftune.errors import EXIT_RUNTIME, FtuneError

    me = dist.get_rank() if dist.is_initialized() else int(__import__("os").environ.get("RANK", "0"))
    others = [r for r in range(plan.world_size) if r != me]
    if len(others) == 1:
        suspects = others
    else:  # gloo names the peer's address; a rank on this host when it is loopback
        ips = re.findall(r"\[?(\d+\.\d+\.\d+\.\d+)\]?:\d+", str(err))
        suspects = others if not ips else [r for r in others if _HOSTS and ips[0].startswith("127.")
                                           and _HOSTS[r] == _HOSTS[me]] or others
    named = ", ".join(f"rank {r} on host {_HOSTS[r] if r < len(_HOSTS) else '?'}" for r in suspects)
    timeout = collective_timeout(plan)
    timed_out = "timed out" in text or "timeout" in text
    what = (f"{named} did not answer within distributed.timeout ({timeout} s)" if timed_out and len(suspects) == 1
            else f"{named} stopped" if len(suspects) == 1 else f"one of {named} stopped")
    return FtuneError(f"{what}; rank {me} can't go on without it ({str(err).splitlines()[0][:160]})",
                      hint="the run dir keeps every complete checkpoint: restart the job (every node) to resume "
                           "from the last one", exit_code=EXIT_RUNTIME)
