"""`distributed:` processes, machines and sharding (DDP, FSDP, DeepSpeed, N-D parallelism)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from ftune.recipe.schema.base import Section


class FsdpSection(Section):
    version: Literal[1, 2] = 2
    """FSDP implementation: 2 (fully_shard, DTensor) or 1 (FullyShardedDataParallel)."""
    sharding_strategy: Literal["full_shard", "shard_grad_op", "hybrid_shard", "no_shard"] = "full_shard"
    """What is sharded across ranks."""
    auto_wrap_policy: Literal["transformer", "size", "none"] = "transformer"
    """How modules become FSDP units: per transformer layer class, by parameter count, or the whole model."""
    transformer_layer_cls: list[str] | None = None
    """Layer class names to wrap; default: the model's `_no_split_modules`."""
    min_num_params: int = Field(100_000_000, gt=0)
    """`size` policy: wrap a module once it holds this many parameters."""
    cpu_offload: bool = False
    """Offload parameters and gradients to CPU."""
    state_dict_type: Literal["full", "sharded"] = "sharded"
    """Checkpoint layout; `final/` is always a full, normal HF/PEFT folder."""
    cpu_ram_efficient_loading: bool = False
    """Load weights on rank 0 only and broadcast (GPU only)."""
    sync_module_states: bool | None = None
    """Broadcast rank 0's weights at wrap time; default: with cpu_ram_efficient_loading. Must be false on CPU."""
    reshard_after_forward: bool = True
    """Free gathered parameters after forward (ZeRO-3 like); false keeps them (ZeRO-2 like)."""
    forward_prefetch: bool = False
    """FSDP v1: prefetch the next unit's all-gather in forward."""
    backward_prefetch: Literal["backward_pre", "backward_post", "none"] = "backward_pre"
    """FSDP v1: when to prefetch in backward."""
    activation_checkpointing: bool = False
    """FSDP-native activation checkpointing, applied after wrapping (instead of train.gradient_checkpointing)."""
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = "auto"
    """FSDP mixed-precision policy; `auto` follows train.mixed_precision."""


class DeepSpeedSection(Section):
    stage: Literal[1, 2, 3] = 2
    """ZeRO stage."""
    offload_optimizer: bool = False
    """Offload optimizer states to CPU."""
    offload_params: bool = False
    """Offload parameters to CPU (stage 3)."""
    config: str | None = None
    """Path to a DeepSpeed JSON config, used as is (relative to the recipe)."""


class ParallelismSection(Section):
    """N-D parallelism (accelerate's ParallelismConfig): how the world's processes split the work. The four
    sizes multiply to the world size (num_processes x num_machines); docs/distributed.md#n-d-parallelism."""

    dp_replicate: int = Field(1, ge=1)
    """Data-parallel replicas (each a whole copy, or an FSDP group with dp_shard: HSDP)."""
    dp_shard: int = Field(1, ge=1)
    """Ranks that shard the parameters, gradients and optimizer state (FSDP2)."""
    tp: int = Field(1, ge=1)
    """Tensor parallelism: each layer's matrices split over this many ranks (the model's tp_plan)."""
    cp: int = Field(1, ge=1)
    """Context parallelism: each sequence split over this many ranks (SDPA ring attention; CUDA only)."""


MAX_NODES = 65_536
"""The most machines a job may have (torch's largest jobs are a few thousand): more is a typo. Also the bound of a
scheduler's node count (`ftune.plan.cluster`) and of `launch-script --nodes`."""
MAX_PROCESSES_PER_NODE = 1_024
"""The most processes per machine (`distributed.num_processes`, a scheduler's per-node count, `--gpus-per-node`)."""


class DistributedSection(Section):
    strategy: Literal["none", "ddp", "fsdp", "deepspeed"] = "none"
    """How processes share the work. Not written, several processes or machines mean `ddp` (the plan notes it)."""
    num_processes: Annotated[int, Field(ge=1, le=MAX_PROCESSES_PER_NODE)] | Literal["auto"] = 1
    """Processes per machine; `auto` means the visible GPUs, else 1."""
    num_machines: int = Field(1, ge=1, le=MAX_NODES)
    """Machines (nodes) in the job."""
    machine_rank: int = Field(0, ge=0, lt=MAX_NODES)
    """This machine's rank, 0..num_machines-1 (usually an override per node)."""
    main_process_ip: str | None = None
    """Address of machine 0 (multi-node)."""
    main_process_port: int | None = Field(None, ge=1, le=65535)
    """Port on machine 0 (multi-node)."""
    rdzv_backend: Literal["static", "c10d"] = "static"
    """Rendezvous backend."""
    same_network: bool = True
    """true: every machine reaches machine 0 directly, and torchrun gets its address and port (static
    master_addr / master_port); false: torchrun meets at a rendezvous endpoint, main_process_ip:main_process_port."""
    timeout: int | None = Field(None, ge=1)
    """Seconds a collective operation may wait for the other processes before the run fails (ddp_timeout;
    transformers' default 1800). Raise it when rank 0 alone does long work (preprocessing, saving)."""
    accelerate_config: str | None = None
    """An existing accelerate config file to start from; the recipe's explicit keys win."""
    parallelism: ParallelismSection | None = None
    """N-D parallelism: data-parallel replicas and shards, tensor and context parallel sizes."""
    expert_parallel_size: int | None = Field(None, ge=1)
    """Mixture-of-experts models: split each layer's experts over this many ranks (expert parallelism). Refused:
    neither accelerate 1.15 nor the Trainer of transformers 5.23 shards fused experts for training (docs/moe.md)."""
    fsdp: FsdpSection | None = None
    """FSDP options (strategy: fsdp)."""
    deepspeed: DeepSpeedSection | None = None
    """DeepSpeed options (strategy: deepspeed)."""

    @model_validator(mode="before")
    @classmethod
    def _processes_mean_ddp(cls, data: Any) -> Any:
        """`num_processes: 2` (or 2 machines) with no `strategy` written means DDP, the one strategy that needs no
        settings: `ftune run r.yaml distributed.num_processes=2` does what it says. A recipe (or base) that writes
        `strategy: none` keeps it, and the rules refuse the contradiction with the override to add."""
        if not isinstance(data, dict) or "strategy" in data:
            return data
        procs, machines = data.get("num_processes"), data.get("num_machines")
        if (type(procs) is int and procs > 1) or (type(machines) is int and machines > 1):
            return {**data, "strategy": "ddp"}
        return data
