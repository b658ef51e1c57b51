"""The frozen Plan: every decision made before launch, the contract between launcher and worker.

`ftune run` compiles a validated Recipe into a Plan, writes it as `<run>/plan.json`, and launches
`accelerate launch ... -m ftune.worker <run>/plan.json`. The worker reads the Plan back
(typed, via `Plan.load`) and carries it out; it decides nothing the Plan already says.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ftune.benchmarks import BenchmarkPlan
from ftune.datafiles.prompts import RunPrompts
from ftune.plan.batching import Collator, DataPlan
from ftune.plan.cluster import ClusterEnv
from ftune.plan.gguf import GgufSource
from ftune.plan.parallelism import Parallel
from ftune.plan.threads import CpuThreads
from ftune.recipe.schema import Recipe
from ftune.rundir import RunDir


class LaunchSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    accelerate_config: dict[str, Any]
    """Contents of `<run>/accelerate.yaml`."""
    command: list[str]
    """The exact `accelerate launch ...` argv."""
    env: dict[str, str] = {}
    """Environment variables the launcher sets for the workers (never secrets)."""


class ModelLoad(BaseModel):
    """How the worker gets the model: `getattr(transformers, auto_class).from_pretrained(path, **kwargs)`
    (or `.from_config(config, **kwargs)` for `init: random`), kwargs unchanged."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    auto_class: Literal["AutoModelForCausalLM", "AutoModelForSequenceClassification", "AutoModelForImageTextToText"]
    path: str
    init: Literal["pretrained", "random"]
    kwargs: dict[str, Any]
    """dtype, trust_remote_code, attn_implementation, revision, quantization_config (a bitsandbytes dict)."""
    config: dict[str, Any] = Field(default_factory=dict)
    """Model config attributes set before the model is built (MoE: `output_router_logits`,
    `router_aux_loss_coef`)."""
    adapter: str | None = None
    """A saved adapter folder (`model.path` pointed at it) that the peft stage loads trainable and trains on,
    instead of adding a fresh adapter; `path` is then the base it was trained on (`ftune.plan.adapter`)."""
    distributed: dict[str, int] | None = None
    """Tensor parallelism: `from_pretrained(..., distributed_config=DistributedConfig(**distributed))` splits the
    weights by the model's tp_plan (`tp_size`) and FSDP2-shards them (`fsdp_size`) as they load
    (`ftune.plan.parallelism`)."""
    layers: list[int] | None = None
    """`model.init_from.layers`: the decoder layers kept, in order, after loading `path` (the model stage builds the
    student from them: `ftune.runtime.layers.keep_layers`); None keeps them all."""
    gguf: GgufSource | None = None
    """The GGUF file `model.path` named (`ftune.plan.gguf`); `path` is then its dequantized copy in the cache, which
    `ftune run` writes before launch when it is not there yet."""


class Plan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ftune_version: str
    recipe_file: str
    """The recipe file the plan was compiled from (absolute)."""
    recipe: Recipe
    """The validated recipe, as it runs: values interpolated from secret environment variables are masked; when
    continuing an adapter, model.path is its base and `peft` its section (`model_load.adapter` names the folder)."""
    secrets: dict[str, str] = {}
    """Dotted recipe path -> environment variable that holds its (masked) value; read by the worker."""
    run_dir: str
    """Absolute run directory."""
    device: Literal["cpu", "cuda"]
    num_processes: int
    """Processes on this machine."""
    world_size: int
    mixed_precision: Literal["no", "fp16", "bf16"]
    """The one autocast precision: the accelerate config and `trainer` (bf16/fp16) both carry it."""
    effective_batch_size: int
    """per_device_batch_size x gradient_accumulation_steps x data-parallel ranks (world_size / (tp x cp))."""
    parallelism: Parallel | None = None
    """`distributed.parallelism` as decided (`ftune.plan.parallelism`): the worker's DistributedConfig / ParallelismConfig."""
    tokenizer_path: str
    """Where the tokenizer is loaded from: `model.tokenizer`, else `model.path`."""
    model_load: ModelLoad
    data: DataPlan
    """What the data stage carries out (`ftune.plan.batching`): the collator (padding | position_ids | block_mask
    | padding_free), packing, the cache root, samples per optimizer step."""
    activation_checkpointing: Literal["trainer", "fsdp"] | None = None
    """Who checkpoints activations, never both: the Trainer (`train.gradient_checkpointing`, on the model; k-bit
    preparation turns it on the same way), FSDP (`distributed.fsdp.activation_checkpointing`, wrapped after
    sharding; it replaces the Trainer's), or nobody."""
    tiled_mlp_shards: int | Literal["auto"] | None = None
    """`train.tiled_mlp` (`ftune.plan.tiling`): the slices of each decoder layer's MLP call, a count or `auto` (the
    call's tokens / hidden size, rounded up); None: not tiled."""
    tiled_loss_shards: int | Literal["auto"] | None = None
    """`train.tiled_loss` (`ftune.plan.tiling`): the slices of each row's output head and loss, a count or `auto`
    (the vocabulary / hidden size, rounded up); None: the model's own loss."""
    upcast_non_quantized: bool = False
    """With a quantized model: k-bit preparation upcasts the unquantized weights to fp32 (peft's default; not
    under FSDP, one dtype per shard). `ftune.plan.quantization.upcasts` decides it."""
    trainer: dict[str, Any]
    """The exact keyword arguments of `config_class` (TrainingArguments or a TRL subclass of it); the worker
    passes them through unchanged."""
    config_class: str = "transformers.TrainingArguments"
    """The class `trainer` is given to: TrainingArguments for sft, TRL's DPOConfig/KTOConfig/ORPOConfig/CPOConfig
    for the preference objectives (`ftune.recipe.objectives`)."""
    trainer_class: str = "transformers.Trainer"
    """The trainer the worker builds: transformers' Trainer, or TRL's for `train.objective`."""
    family: str
    """The objective's family (`ftune.recipe.objectives.FAMILIES`: sft, preference, reward, rl, distill): the worker,
    the data stage and `eval` dispatch on it (its trainer builder, its rows)."""
    teacher: ModelLoad | None = None
    """distill: the teacher as the worker loads it (frozen, whole; `ftune.plan.distill.teacher_load`)."""
    uses_bitsandbytes: bool = True
    """Whether the run needs bitsandbytes (a quantized model, or a bitsandbytes optimizer). When it doesn't, the
    worker keeps it from being imported: transformers' Trainer and peft import it whenever it is installed, which
    costs about 1.5 s of every worker start (measured on a 2-core CPU machine: 7.3 s -> 5.8 s)."""
    fsdp_mixed_precision: dict[str, str | None] | None = None
    """FSDP2's MixedPrecisionPolicy (torch dtype names) the worker sets on accelerate's FSDP plugin before any
    model is wrapped; None: accelerate's (parameters, gradient reduction and outputs all in `mixed_precision`)."""
    resume_from: str | None = None
    """Checkpoint the worker resumes from (decided at compile time), or None for a fresh start."""
    generate_metrics: list[str] | None = None
    """eval.generate's metrics (`ftune.plan.evaluation`): the recipe's, else those that fit its data; None without
    eval.generate."""
    prompt: RunPrompts | None = None
    """How the trained model is prompted after training (`ftune generate`, `chat`, `eval`, eval.generate, the merged
    folder's chat template): chat, instruction or text, as the training data rendered its prompts
    (`ftune.datafiles.prompts.decide`). None in a plan written before ftune recorded it: read from the recipe then."""
    benchmarks: BenchmarkPlan | None = None
    """eval.benchmarks as the run measures them (lm-eval harness tasks, include folders absolute, batch size, when);
    None without it (`ftune.benchmarks.plan`)."""
    cpu_threads: CpuThreads | None = None
    """CPU threads per process and OpenMP's wait policy, and why (`ftune.plan.threads`), on CPU and CUDA; None in a
    plan compiled for other machines (`gpus=`): the run there decides."""
    launch: LaunchSpec
    cluster: ClusterEnv | None = None
    """The job's shape as the launcher's environment gave it (torchrun, Kubeflow PET_*, MPI, Slurm), with the
    variable each value came from; None when `ftune run` was started outside any launcher."""
    notes: list[str] = []
    """Decisions worth telling the user (e.g. 'bf16 on CPU: autocast')."""
    warnings: list[str] = []
    """The pre-launch checks' warnings, located and rendered (e.g. a LoRA target list half of which matches
    nothing): shown by `run` and `plan`; training goes on."""

    @property
    def collator(self) -> Collator:
        """How the data stage batches rows (`data.collator`)."""
        return self.data.collator

    @property
    def machine_rank(self) -> int:
        """This node's rank in a multi-node job (0 on one machine)."""
        return self.recipe.distributed.machine_rank

    @property
    def run(self) -> RunDir:
        return RunDir(Path(self.run_dir))

    def secret(self, path: str) -> str | None:
        """The real value of a masked field, read from its environment variable at run time."""
        env = self.secrets.get(path)
        return os.environ.get(env) if env else None

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        return cls.model_validate_json(Path(path).read_text())
