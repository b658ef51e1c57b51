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


# ------------------------------------------------------------------------------ FSDP2 mixed precision
def set_mixed_precision_policy(accelerator, plan) -> None:
    """Give accelerate's FSDP plugin the Plan's MixedPrecisionPolicy (`plan.fsdp_mixed_precision`). Called as soon
    as the Trainer has its accelerator, before TRL wraps a reference model or `train()` wraps the policy."""
    spec = plan.fsdp_mixed_precision
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    if spec is None or plugin is None:
        return
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    plugin.mixed_precision_policy = MixedPrecisionPolicy(
        **{key: None if name is None else getattr(torch, name) for key, name in spec.items()})


def prepare(plan) -> None:
    """Called by the worker before TrainingArguments/the Trainer exist."""
    d = plan.recipe.distributed
    if d.strategy == "fsdp" and d.fsdp is not None and d.fsdp.version == 1 and plan.recipe.peft.uses_peft_library:
        apply_fsdp1_adapter_names_fix()
    if plan.recipe.distributed.strategy != "fsdp" or plan.device != "cpu":
        return
    import warnings

    import torch

    if torch.cuda.is_available():
        return
    warnings.filterwarnings("ignore", message=".*Module is put on CPU.*")
    apply_cpu_fsdp_shim()


def close() -> None:
    """Destroy the process group at the end of a finished run, before the interpreter exits. Left to the exit,
    gloo's threads can be torn down while still joinable, and a rank that finished its work aborts with
    "terminate called without an active exception" (exit -6; seen once in 2-process FSDP2 runs), which the
    launcher reports as a failed run. Local: no collective, so it can't hang on a peer."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
