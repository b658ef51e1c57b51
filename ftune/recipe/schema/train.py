"""`train:` optimisation, and the settings of the objectives beside sft (preference, rl, distill)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ftune.plugins import merged as merged_plugins
from ftune.recipe.schema.base import Section

LR_SCHEDULERS = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "reduce_lr_on_plateau",
    "cosine_with_min_lr",
    "warmup_stable_decay",
)


class RouterCollapse(Section):
    """Stop a mixture-of-experts run whose router sends (nearly) every token to one expert."""

    max_share: float = Field(0.9, gt=0.0, le=1.0)
    """Largest fraction of a layer's tokens one expert may receive, measured over each logging interval."""
    logs: int = Field(3, ge=1)
    """Logging intervals in a row above max_share that stop the run."""


class DataloaderSection(Section):
    workers: int = Field(0, ge=0)
    """Worker processes that load batches; 0 loads them in the training process."""
    pin_memory: bool = True
    """Pin host memory for faster copies to the GPU (not used on CPU)."""
    prefetch_factor: int | None = Field(None, ge=1)
    """Batches each worker loads ahead (needs workers > 0)."""


class CallbackSpec(Section):
    name: str
    """A callback registered by an installed plugin (`ftune validate` lists them)."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Its arguments, validated by the plugin's own model."""


class EarlyStopping(Section):
    patience: int = Field(3, ge=1)
    """Evaluations without improvement before stopping."""
    metric: str = "eval_loss"
    """Metric watched (lower is better for *loss/perplexity, higher otherwise)."""
    threshold: float = Field(0.0, ge=0.0)
    """Minimum improvement that counts."""


class PreferenceSection(Section):
    """Settings of the preference objectives; each key is refused where its objective has no use for it."""

    beta: float | None = Field(None, gt=0)
    """Strength of the preference term (dpo, kto: deviation from the reference; orpo: odds-ratio weight; simpo: reward
    scale). Default: TRL's, 2.0 for simpo."""
    loss_type: str | None = None
    """dpo: sigmoid (default), hinge, ipo, robust, exo_pair, ...; kto: kto (default) or apo_zero_unpaired."""
    label_smoothing: float | None = Field(None, ge=0.0, lt=0.5)
    """dpo and simpo: probability that a pair's preference is flipped (robust DPO, cDPO)."""
    reference: Literal["model", "precomputed"] | None = None
    """dpo and kto: `model` (default) scores the reference during training (LoRA/QLoRA: the base with the adapter
    disabled; full fine-tuning: a frozen copy); `precomputed` scores it once before training and keeps no copy."""
    gamma: float | None = Field(None, ge=0.0)
    """simpo: target reward margin (TRL's simpo_gamma); default 0.5."""
    desirable_weight: float | None = Field(None, gt=0)
    """kto: weight of desirable completions (raise it when they are rarer)."""
    undesirable_weight: float | None = Field(None, gt=0)
    """kto: weight of undesirable completions."""


class RewardSpec(BaseModel):
    """One reward: `{name, weight, ...its arguments}`; the arguments are checked by the reward's own model."""

    model_config = ConfigDict(extra="allow", frozen=True, use_attribute_docstrings=True, allow_inf_nan=False)

    name: str
    """A built-in reward (exact_match, contains, numeric, regex, choice, json, length, think_format,
    repetition_penalty, soft_overlong_punishment, reward_model) or one an installed plugin registers."""
    weight: float = 1.0
    """Its weight in the total reward (TRL's reward_weights)."""

    @property
    def args(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ToolSpec(BaseModel):
    """One tool: `{name, ...its arguments}`; the arguments are checked by the tool's own model."""

    model_config = ConfigDict(extra="allow", frozen=True, use_attribute_docstrings=True, allow_inf_nan=False)

    name: str
    """A built-in tool (calculator, lookup, regex_extract; `python` is refused: no sandbox) or one an installed
    plugin registers."""

    @property
    def args(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class GenerationSection(Section):
    backend: Literal["transformers", "paged", "vllm"] = "transformers"
    """How completions are sampled: the training model through transformers' generate; `paged`, the same model
    through transformers' continuous batching (TRL's `use_transformers_continuous_batching`: a paged KV cache,
    finished completions make room for waiting ones; sdpa or eager attention, LoRA/full/freeze, text models); or
    vLLM (CUDA only; `pip install vllm`). `ftune plan` shows the KV cache each reserves."""
    vllm_mode: Literal["colocate", "server"] = "colocate"
    """vllm: `colocate` runs vLLM in the training processes (a share of GPU memory), `server` talks to
    `trl vllm-serve`."""
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0.0, lt=1.0)
    """vllm colocate: the share of each GPU's memory vLLM takes."""


class RLSection(Section):
    """Settings of the online RL objectives (grpo, rloo): TRL's meanings; unset keys take TRL's defaults."""

    rewards: list[RewardSpec] = Field(default_factory=list)
    """The rewards summed (weighted) into each completion's reward."""
    num_generations: int | None = Field(None, ge=2)
    """Completions sampled per prompt (a group; TRL's default: grpo 8, rloo 2). per_device_batch_size x
    gradient_accumulation_steps x processes counts completions and must be a multiple of it."""
    max_completion_length: int = Field(512, ge=1)
    """Longest completion in tokens; a longer one is cut (clipped)."""
    temperature: float = Field(1.0, gt=0.0)
    """Sampling temperature."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass."""
    beta: float | None = Field(None, ge=0.0)
    """KL coefficient against the reference (TRL's default: grpo 0, rloo 0.05; 0: no reference model; LoRA: the
    adapter disabled, full: a frozen copy)."""
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"] | None = None
    """grpo only: how token losses are aggregated (TRL's default dapo; with `importance_sampling_level: sequence`,
    ftune's default is grpo, the GSPO paper's)."""
    importance_sampling_level: Literal["token", "sequence"] | None = None
    """grpo only: the policy ratio per token (TRL's default) or per sequence (GSPO: one geometric-mean ratio per
    completion; loss_type grpo or luspo)."""
    epsilon: float = Field(0.2, gt=0.0)
    """Clipping range of the policy ratio (its lower side when epsilon_high is set)."""
    epsilon_high: float | None = Field(None, gt=0.0)
    """The upper clipping range (DAPO's clip-higher, e.g. 0.28), at least epsilon; unset: epsilon."""
    delta: float | None = Field(None, gt=1.0)
    """grpo only: two-sided clipping, the ratio's upper bound for negative advantages (above 1 + epsilon)."""
    mask_truncated_completions: bool = False
    """Leave completions cut at max_completion_length out of the loss (DAPO): a cut answer isn't scored as wrong."""
    top_entropy_quantile: float = Field(1.0, gt=0.0, le=1.0)
    """grpo only: train only on this top share of tokens by entropy (0.2 in "Beyond the 80/20 Rule"); 1: all."""
    scale_rewards: Literal["group", "batch", "none"] | None = None
    """grpo only: divide advantages by the group's std (TRL's default), the batch's, or not at all (Dr. GRPO)."""
    num_iterations: int = Field(1, ge=1)
    """Optimisation passes over each generated batch (mu)."""
    generation: GenerationSection = Field(default_factory=GenerationSection)
    """Where completions are generated."""
    guard_logs: int = Field(3, ge=1)
    """Stop the run when, for this many training logs in a row, every group's rewards are identical (all
    advantages zero: nothing to learn; unless they are flat at the run's best after varying: saturated, a note) or
    every completion is clipped at max_completion_length."""
    completions_sample: int = Field(8, ge=0)
    """Completions (with their rewards) written to completions.jsonl per log; 0 writes none."""
    tools: list[ToolSpec] = Field(default_factory=list)
    """grpo only: tools the policy may call while it answers (TRL's multi-turn tool loop): the prompts stay chat
    messages, the chat template shows the tools, each call's result is appended as a `tool` turn (masked from the
    loss) and generation continues (docs/rl.md#tools)."""
    max_tool_calls: int = Field(3, ge=1)
    """grpo with tools: tool-calling rounds per completion at most (TRL's max_tool_calling_iterations)."""
    tool_error_reward: float = 0.0
    """grpo with tools: the reward of a completion with a tool call that failed (raised, didn't fit the tool's
    arguments, named no tool, or ran past tool_timeout); its other rewards count 0."""
    tool_format: Literal["hermes"] = "hermes"
    """grpo with tools: how the chat template writes a tool call and how completions are parsed for one: `hermes`
    (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` in ChatML turns, Qwen2.5's and Hermes' format; the
    built-in chat template `hermes` renders it)."""
    tool_timeout: float = Field(5.0, gt=0.0, le=600.0)
    """grpo with tools: seconds one tool call may take; one past it is killed (its process restarted) and is a tool
    error."""
    reward_timeout: float = Field(10.0, gt=0.0, le=600.0)
    """Seconds one reward may take on one completion. The rewards run in a process of their own: one past its
    limit (a regex that backtracks, a plugin that loops) is killed and stops the run (exit 3) naming the reward and
    the row, after a checkpoint of the last complete step."""


class DistillSection(Section):
    """Settings of `train.objective: distill` (TRL's GKD trainer): the student (`model`) learns the teacher's
    next-token distributions on the data's completions and, for a share of the batches, on its own samples."""

    teacher: str
    """The teacher model: a local folder or hub id (a trained adapter must be merged first: `ftune merge`). It must
    share the student's tokenizer (vocabulary and special tokens); it is loaded frozen, in `dtype`."""
    loss: Literal["forward_kl", "reverse_kl", "jsd"] = "forward_kl"
    """The divergence: `forward_kl` KL(teacher || student) (mode covering; GKD's beta 0), `reverse_kl`
    KL(student || teacher) (mode seeking; beta 1), `jsd` the generalized Jensen-Shannon divergence mixed by `beta`."""
    beta: float | None = Field(None, gt=0.0, lt=1.0)
    """`jsd` only: the mix of the generalized JSD (0.5: the symmetric JSD; towards 0 forward KL, towards 1
    reverse KL). Default 0.5."""
    on_policy: float = Field(0.0, ge=0.0, le=1.0)
    """The share of batches whose completions the student samples itself before the teacher scores them (GKD's
    lmbda; on-policy distillation); the others use the data's completions. 0: off-policy (supervised KD)."""
    teacher_sequences: bool = False
    """Sequence-level KD: the batches that are not on-policy use completions the teacher samples instead of the
    data's (GKD's seq_kd)."""
    temperature: float = Field(1.0, gt=0.0)
    """Sampling temperature of the generated completions (on-policy, teacher_sequences). TRL's GKD computes the
    divergence itself at temperature 1."""
    max_new_tokens: int = Field(64, ge=1)
    """Longest generated completion, in tokens."""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """The teacher's weights' dtype; default: the student's (`model.dtype`, float32 when `auto`)."""


BUILTIN_OBJECTIVES = ("sft", "dpo", "orpo", "kto", "simpo", "reward", "grpo", "rloo", "distill")
# a plugin objective joins one of ftune.recipe.objectives.FAMILIES; it can't shadow a built-in name
OBJECTIVES = (*BUILTIN_OBJECTIVES,
              *sorted(merged_plugins("objectives", BUILTIN_OBJECTIVES).keys() - set(BUILTIN_OBJECTIVES)))


class TrainSection(Section):
    objective: Literal[OBJECTIVES] = "sft"  # type: ignore[valid-type]
    """What is optimised: `sft` (next-token loss), a preference objective on TRL's trainers (`dpo`, `orpo`, `kto`,
    `simpo`), a reward model (`reward`: a one-logit sequence classifier trained on preference pairs, with
    `model.task: sequence-classification`), online RL from rewards (`grpo`, `rloo`, on `format: prompt` data), or
    knowledge distillation from a teacher (`distill`, with `train.distill`, on sft data); TRL's need
    `pip install 'ftune[preference]'`."""
    preference: PreferenceSection | None = None
    """Settings of the preference objective (beta, loss_type, label_smoothing, reference, ...)."""
    rl: RLSection | None = None
    """Settings of grpo and rloo: rewards, generations per prompt, completion length, sampling, KL."""
    distill: DistillSection | None = None
    """Settings of `distill`: the teacher, the divergence, the on-policy share (docs/distillation.md)."""
    epochs: float | None = Field(None, gt=0)
    """Passes over the training data (or set max_steps)."""
    max_steps: int | None = Field(None, gt=0)
    """Optimizer steps; overrides epochs."""
    learning_rate: float = Field(2e-4, gt=0)
    """Peak learning rate."""
    lr_scheduler: Literal[LR_SCHEDULERS] = "linear"  # type: ignore[valid-type]
    """Learning-rate schedule (transformers' SchedulerType)."""
    warmup_ratio: float | None = Field(None, ge=0.0, lt=1.0)
    """Warmup as a fraction of total steps (or set warmup_steps)."""
    warmup_steps: int | None = Field(None, ge=0)
    """Warmup in steps (or set warmup_ratio)."""
    weight_decay: float = Field(0.0, ge=0.0)
    """AdamW weight decay."""
    global_batch_size: int | None = Field(None, ge=1)
    """Rows per optimizer step over all data-parallel ranks. Set, the accumulation follows from it
    (global_batch_size / (per_device_batch_size x data-parallel ranks)), so the optimizer's batch stays the same on
    any machine and number of processes; `per_device_batch_size: auto` needs it."""
    per_device_batch_size: Annotated[int, Field(ge=1)] | Literal["auto"] = 1
    """Samples (rows) per device per forward. `auto` (with `global_batch_size`): `ftune plan` / `ftune run` pick
    the micro-batch from the memory they predict on the device: of the divisors of the rows each data-parallel rank
    takes per step, the fastest that fits (docs/performance.md#micro-batch-and-checkpointing-chosen-by-the-plan)."""
    gradient_accumulation_steps: int = Field(1, ge=1)
    """Forwards accumulated per optimizer step (derived from `global_batch_size` when that is set)."""
    gradient_checkpointing: bool | Literal["auto"] = False
    """Recompute activations in backward to save memory. `auto`: the plan turns it on only when the fastest
    micro-batch that fits needs it (a step with checkpointing recomputes the forward)."""
    mixed_precision: Literal["no", "fp16", "bf16"] = "no"
    """Autocast precision (bf16 works on CPU)."""
    precision: Literal["fp8"] | None = None
    """`fp8`: the linear layers' matmuls in float8 (torchao's float8 training, dynamic tensorwise scaling; the
    output head and MoE routers stay bf16), with `mixed_precision: bf16` and `compile: true`. Needs a GPU with FP8
    tensor cores (compute capability >= 8.9: Ada, Hopper, Blackwell) and `pip install 'ftune[fp8]'`. `ftune plan`
    shows the layers converted and the step cost beside bf16."""
    optimizer: str = "adamw_torch_fused"
    """Any transformers `optim` name (adamw_torch_fused, adamw_torch, adamw_8bit, paged_adamw_8bit, galore_adamw, ...);
    the default is transformers' own with torch >= 2.8 (fused AdamW, on CPU too)."""
    optimizer_args: dict[str, bool | int | float | str | list[float] | list[str]] | None = None
    """Optimizer settings: `betas: [0.9, 0.95]` and `eps` for Adam-style optimizers; `target_modules` (required by
    galore_*/apollo_*) plus optimizer-specific keys such as `rank`, `update_proj_gap`, `scale` (transformers' optim_args)."""
    lr_scheduler_args: dict[str, bool | int | float | str] | None = None
    """Scheduler settings (transformers' lr_scheduler_kwargs): `min_lr` or `min_lr_rate` for cosine_with_min_lr,
    `num_decay_steps` for warmup_stable_decay, `num_cycles`, `lr_end`/`power` for polynomial, ..."""
    max_grad_norm: float = Field(1.0, ge=0.0)
    """Gradient clipping norm; 0 disables it."""
    threads: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
    """CPU compute threads per process (on a GPU, the host side's). `auto`: the physical cores divided among the
    processes. With more than one thread, OpenMP's wait policy comes from the CPUs' load at launch: active
    (waiting threads spin) when the CPUs have room for the run's threads, else passive (they sleep, so a busy
    machine doesn't stall every step). An `OMP_NUM_THREADS` or `OMP_WAIT_POLICY` in the environment wins.
    Shown in the run header and plan.json."""
    seed: int = 42
    """Seed for data order, initialisation and dropout."""
    logging_steps: int = Field(10, ge=1)
    """Log loss and learning rate every N steps."""
    neftune_alpha: float | None = Field(None, gt=0)
    """NEFTune noise scale on embeddings."""
    router_collapse: RouterCollapse | None = Field(default_factory=RouterCollapse)
    """Mixture-of-experts models: the per-expert token share is logged (`expert_share_max`, `expert_share`) and
    a run stops when one expert takes more than `max_share` of a layer's tokens for `logs` logs in a row; null
    turns the guard off (the share is still logged)."""
    early_stopping: EarlyStopping | None = None
    """Stop when the eval metric stops improving (needs eval)."""
    log_level: Literal["debug", "info", "warning", "error", "critical", "passive"] = "warning"
    """transformers log level on the main process."""
    log_level_replica: Literal["debug", "info", "warning", "error", "critical", "passive"] = "error"
    """transformers log level on the other processes."""
    compile: bool = False
    """torch.compile the model (CPU and GPU); the first steps pay the compile time."""
    compile_backend: Literal["inductor", "aot_eager", "cudagraphs"] | None = None
    """torch.compile backend (default inductor); `aot_eager` traces and compiles the graph without code generation."""
    kernels: Literal["none", "liger"] = "none"
    """Fused kernels: `liger` = Liger Kernel's RMSNorm, RoPE, SwiGLU and fused linear cross-entropy (logits are never
    materialised). CUDA only; `pip install 'ftune[kernels]'`."""
    group_by_length: bool = False
    """Batch samples of similar length together (less padding); not with packing."""
    dataloader: DataloaderSection = Field(default_factory=DataloaderSection)
    """How batches are loaded."""
    activation_offloading: bool = False
    """Move activations saved for backward to CPU memory during forward and back for backward (long context). With
    `gradient_checkpointing` these are the checkpointed layer inputs: ALST's offloaded checkpoints."""
    tiled_mlp: bool = False
    """Run each decoder layer's MLP over its tokens in slices, forward without autograd and backward recomputing one
    slice at a time (ALST's tiled MLP): the MLP's intermediates exist for one slice only. Long context; dense
    decoders with a `mlp` module per layer; not with DeepSpeed."""
    tiled_mlp_shards: int | None = Field(default=None, ge=1)
    """Slices per MLP call; default the call's tokens / hidden size, rounded up (ALST's choice)."""
    tiled_loss: bool = False
    """Compute a causal LM's output head and cross-entropy over the row's tokens in slices, each slice's logits
    recomputed in its backward (ALST's sequence tiling of the loss): logits and their gradients exist for one slice
    only (evaluation's loss is sliced too). Long context, on any device; what `kernels: liger` does on CUDA. The
    `sft` family; the model families ftune verified it on (`ftune.tiled_loss.VERIFIED`); not with DeepSpeed."""
    tiled_loss_shards: int | None = Field(default=None, ge=1)
    """Slices per row; default the vocabulary / hidden size, rounded up (a slice's logits about the size of the
    row's hidden states, as Liger chunks)."""
    callbacks: list[CallbackSpec] = Field(default_factory=list)
    """Trainer callbacks registered by installed plugins, by name (a recipe never names code)."""
