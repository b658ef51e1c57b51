"""The recipe schema: one typed model per section, the single source of truth.

Each field's documentation sits under it; it becomes the JSON Schema description (`make schemas`)
and the text `ftune show` and the docs use. The validated `Recipe` is what the rest of ftune
reads: it is never dumped back to an untyped dict before use.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ftune.methods import config_classes
from ftune.plugins import merged as merged_plugins
from ftune.recipe.trackers import NAMES as TRACKER_NAMES

SCHEMA_VERSION = 1
BUILTIN_FORMATS = ("text", "instruction", "chat", "pretokenized", "classification", "preference",
                   "unpaired-preference", "prompt", "vision-chat", "vision-preference", "vision-prompt")
# a plugin format can't shadow a built-in one (ftune.plugins.merged refuses it)
FORMATS = (*BUILTIN_FORMATS, *sorted(merged_plugins("formats", BUILTIN_FORMATS).keys() - set(BUILTIN_FORMATS)))
FORMAT_ALIASES: dict[str, dict[str, Any]] = {
    "sharegpt": {"format": "chat", "fields": {"messages": "conversations", "role": "from", "content": "value"},
                 "roles": {"human": "user", "gpt": "assistant", "system": "system"}},
    "alpaca": {"format": "instruction"},
    "tokens": {"format": "pretokenized"},
}
"""Format names other tools use, and the source settings each stands for (what `ftune show` prints); keys the
recipe sets itself win over the alias's."""


class Section(BaseModel):
    """Base of every section: unknown keys are errors, numbers are finite, values are frozen after validation."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True, allow_inf_nan=False)


# --------------------------------------------------------------------------------------------- model
class SpecialTokens(Section):
    """Special tokens set on the tokenizer before training (and saved with it)."""

    pad_token: str | None = None
    """Padding token (never trained: padding carries no loss); default: the tokenizer's, else eos."""
    eos_token: str | None = None
    """End-of-sequence token: what ends an answer, so what generation stops on (e.g. `<|im_end|>` for chatml)."""
    bos_token: str | None = None
    """Beginning-of-sequence token."""
    unk_token: str | None = None
    """Unknown token."""


class InitFrom(Section):
    """A student built from a larger model of the same architecture: its embeddings, final norm and head, and the
    decoder layers listed, copied in order into a config with `num_hidden_layers: len(layers)`
    (docs/distillation.md)."""

    path: str
    """The model (a local folder or hub id, e.g. the teacher) whose layers are copied."""
    layers: list[int] = Field(min_length=1)
    """Indices of the decoder layers kept, increasing and each once (e.g. every other one: [0, 2, 4, ...])."""


class ModelSection(Section):
    path: str
    """Local folder with config.json (and weights unless `init: random`), or a hub id (from the hub; with
    `HF_HUB_OFFLINE=1`, from the Hugging Face cache only: docs/distributed.md); a `.gguf` file (see `gguf_file`); or a
    saved adapter folder (a run's `final/`): that adapter is trained on, over the base it names (`peft:` keys left
    unset are taken from it, set ones must agree); a merged folder (`ftune merge`) is a plain model."""
    gguf_file: str | None = None
    """A `.gguf` file inside the folder `path` names (or set `path` to the .gguf itself): ftune dequantizes it once
    into its cache (~/.cache/ftune/models, keyed by the file's sha256; FTUNE_MODEL_CACHE overrides) as a plain
    Hugging Face folder with its tokenizer and chat template, and trains on that (docs/gguf.md)."""
    task: Literal["causal-lm", "sequence-classification", "image-text-to-text"] = "causal-lm"
    """What the model is trained to do; `image-text-to-text`: a vision-language model (AutoModelForImageTextToText
    with its AutoProcessor) trained on `format: vision-chat` rows (docs/vision.md)."""
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "auto"
    """Dtype the weights are loaded in; `auto` takes the checkpoint's own (float32 when unset)."""
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2", "flex_attention"] | None = None
    """Attention kernel; default: transformers' choice (sdpa where available)."""
    trust_remote_code: bool = False
    """Run modelling code shipped with the checkpoint. Off unless the recipe sets it."""
    init: Literal["pretrained", "random"] = "pretrained"
    """`pretrained` loads the weights; `random` builds the model from the folder's config (from-scratch runs)."""
    revision: str | None = None
    """Hub revision (branch, tag or commit) when `path` is a hub id; offline, the cache's snapshot at that
    revision (the tokenizer's too)."""
    config: str | None = None
    """A local config.json (or a folder holding one) that `ftune plan` builds the model from when `path` has
    none of its own: `path` as a local folder, then the offline HF cache, then this, then the bundled catalog."""
    tokenizer: str | None = None
    """Tokenizer folder or hub id; default: `path`."""
    num_labels: int | None = Field(None, ge=2)
    """Number of classes for `task: sequence-classification`; default: len(labels)."""
    labels: list[str] | None = None
    """Class names for `task: sequence-classification`, in id order."""
    hub_token: str | None = None
    """Hub access token; write `${env:HF_TOKEN}` so it is read from the environment and masked in outputs."""
    special_tokens: SpecialTokens | None = None
    """Override the tokenizer's special tokens (a token not in the vocabulary is added, as with add_tokens)."""
    router_aux_loss_coef: float | None = Field(None, ge=0.0)
    """Mixture-of-experts models: weight of the router's load-balancing loss added to the training loss (the
    config's `router_aux_loss_coef`); setting it turns on `output_router_logits`. Default: the model's own."""
    output_router_logits: bool | None = None
    """Mixture-of-experts models: compute the router's load-balancing loss (added to the loss, logged as
    `aux_loss` in metrics.jsonl). Default: on when `router_aux_loss_coef` is set, else the model's config."""
    init_from: InitFrom | None = None
    """Build the model from another one's layers (`{path, layers}`; `model.path` may then be left out: it is
    `init_from.path`), e.g. a distillation student half as deep as its teacher. Built in the worker's model stage
    from the Plan (`plan.model_load.layers`)."""
    add_tokens: list[str] | None = None
    """Tokens added to the vocabulary (e.g. chat markers `<|im_start|>`); the embeddings are resized and the rows
    of these tokens (and of the special tokens set here, pad aside) train — with LoRA, saved with the adapter
    (the whole matrices instead when peft.modules_to_save names the embedding and head)."""

    @model_validator(mode="before")
    @classmethod
    def _path_from_init(cls, data: Any) -> Any:
        """`init_from: {path: P, layers: [...]}` without `path`: the model is P's, so `path` is P (its config, its
        tokenizer); a recipe that writes both must write the same folder (`ftune.recipe.rules.distill`)."""
        if isinstance(data, dict) and "path" not in data and isinstance(data.get("init_from"), dict) \
                and isinstance(data["init_from"].get("path"), str):
            return {**data, "path": data["init_from"]["path"]}
        return data


# ---------------------------------------------------------------------------------------------- data
class Fields(Section):
    """Column names in the source, per format. Defaults follow the common conventions."""

    text: str = "text"
    """`text` and `classification`: the text column."""
    instruction: str = "instruction"
    """`instruction`: the instruction column."""
    input: str = "input"
    """`instruction`: the optional input/context column."""
    output: str = "output"
    """`instruction`: the response column."""
    messages: str = "messages"
    """`chat` and `vision-chat`: the list of messages (sharegpt data often uses `conversations`)."""
    role: str = "role"
    """`chat`: the role key inside a message (sharegpt: `from`)."""
    content: str = "content"
    """`chat`: the content key inside a message (sharegpt: `value`)."""
    input_ids: str = "input_ids"
    """`pretokenized`: token ids."""
    labels: str = "labels"
    """`pretokenized`: optional labels (-100 = not trained)."""
    attention_mask: str = "attention_mask"
    """`pretokenized`: optional mask of 1s and 0s; tokens under a 0 (padding) are dropped, since ftune batches and
    pads rows itself."""
    label: str = "label"
    """`classification`: the label column (a name from model.labels, or an integer id); `unpaired-preference`:
    the desirable flag (true/false)."""
    prompt: str = "prompt"
    """`preference`, `unpaired-preference` and `prompt`: the prompt (a string, or a list of chat messages)."""
    answer: str = "answer"
    """`prompt`: the reference answer the rewards compare completions with (optional unless a reward reads it)."""
    chosen: str = "chosen"
    """`preference`: the preferred completion (a string, or a list of assistant messages)."""
    rejected: str = "rejected"
    """`preference`: the dispreferred completion (a string, or a list of assistant messages)."""
    completion: str = "completion"
    """`unpaired-preference`: the completion that `label` marks desirable or not."""
    images: str = "images"
    """`vision-preference` and `vision-prompt`: an optional list of image paths that fills the prompt's
    `{type: image}` parts naming no file, in order (a string prompt: its images come before the text)."""


class DataSource(Section):
    path: str
    """A local file (.jsonl/.json/.csv/.parquet/.txt), a glob of such files (`data/shard-*.jsonl`), a `save_to_disk`
    folder, or a hub dataset name."""
    format: Literal[(*FORMATS, *FORMAT_ALIASES)] = "text"  # type: ignore[valid-type]
    """How rows become tokens and labels (built in, or registered by an installed plugin); `preference`
    (prompt/chosen/rejected) and `unpaired-preference` (prompt/completion/label) feed the preference objectives
    (train.objective); `prompt` (prompt, answer?, any other columns) feeds grpo and rloo; on a vision-language model
    (`model.task: image-text-to-text`) `vision-chat` feeds sft, `vision-preference` dpo and `vision-prompt` grpo
    (docs/vision.md). Aliases: `sharegpt` = `chat` with `fields: {messages: conversations, role: from, content:
    value}` and `roles: {human: user, gpt: assistant, system: system}`; `alpaca` = `instruction`; `tokens` = `pretokenized`."""
    type: Literal["auto", "json", "csv", "parquet", "text", "disk", "hub"] = "auto"
    """Loader; `auto` picks from the file extension (or `disk` for a save_to_disk folder)."""
    split: str = "train"
    """Split to read when the source holds several; `datasets` slice syntax selects part of it: `train[:20%]`,
    `train[100:200]`, `train[:50%]+validation[:10%]`."""
    fields: Fields = Field(default_factory=Fields)
    """Column names, when they differ from the defaults."""
    template: str | None = None
    """`instruction`: prompt template with {instruction} and {input}; the output follows it (with `as_chat`: the
    user turn)."""
    as_chat: bool = False
    """`instruction`: render each row through `data.chat_template` as one user turn (instruction, then input)
    and one assistant turn (output), instead of a plain prompt template."""
    roles: dict[str, str] | None = None
    """`chat`: map source role names to user/assistant/system, e.g. {human: user, gpt: assistant}."""
    weight: float | None = Field(None, gt=0)
    """Relative sampling weight when several sources are mixed: with `data.mix: concat` the source is resampled to
    its share of the total rows; with `interleave`, the probability that the next sample comes from it."""
    limit: int | None = Field(None, gt=0)
    """Use at most this many rows of the source (streaming: of each of its files)."""

    @property
    def is_glob(self) -> bool:
        return any(c in self.path for c in "*?[")

    def files(self) -> list[str]:
        """The local files `path` names: itself, or the sorted matches of a glob (absolute paths), without the
        matches inside an ftune run dir below the pattern's fixed folder (`run_dir_matches`)."""
        from pathlib import Path

        path = Path(self.path).expanduser()
        if self.is_glob:
            return [p for p, in_run in self._matches() if not in_run]
        return [str(path.resolve())] if path.is_file() else []

    def run_dir_matches(self) -> list[str]:
        """A glob's matches that lie in an ftune run dir (its completions.jsonl, metrics.jsonl, checkpoints),
        skipped: a run's own outputs never become its (or a later run's) training data."""
        return [p for p, in_run in self._matches() if in_run] if self.is_glob else []

    def _matches(self) -> list[tuple[str, bool]]:
        import glob
        from pathlib import Path

        from ftune.outputs import RUN_MARKER

        pattern = Path(self.path).expanduser()
        fixed = next((i for i, part in enumerate(pattern.parts) if any(c in part for c in "*?[")), 0)
        root = Path(*pattern.parts[:fixed]).resolve() if fixed else Path.cwd()
        out = []
        for p in sorted(str(Path(m).resolve()) for m in glob.glob(str(pattern)) if Path(m).is_file()):
            below = [d for d in Path(p).parents if d != root and root in d.parents]
            out.append((p, any((d / RUN_MARKER).is_file() for d in below)))
        return out

    @model_validator(mode="before")
    @classmethod
    def _expand_alias(cls, data: Any) -> Any:
        """`format: sharegpt` / `alpaca`: the settings they stand for (FORMAT_ALIASES), under the recipe's own."""
        written = data.get("format") if isinstance(data, dict) else None
        alias = FORMAT_ALIASES.get(written) if isinstance(written, str) else None  # a list or dict: validation says
        if alias is None:
            return data
        out = {**data, "format": alias["format"]}
        for key in ("fields", "roles"):
            own = data.get(key)
            if key in alias and (own is None or isinstance(own, dict)):  # another type: validation reports it
                out[key] = {**alias[key], **(own or {})}
        return out


class ImageSettings(Section):
    """How `vision-chat` images are read before the model's image processor sees them (docs/vision.md)."""

    max_pixels: int = Field(1024 * 1024, gt=0)
    """The most pixels (width x height) an image may have; a larger one is scaled down to fit (`resize: fit`) or
    refused (`resize: none`)."""
    min_pixels: int = Field(1, gt=0)
    """The fewest pixels an image may have; a smaller one is scaled up (`resize: fit`) or refused (`resize: none`)."""
    resize: Literal["fit", "none"] = "fit"
    """`fit`: scale an image into [min_pixels, max_pixels] keeping its aspect ratio; `none`: refuse one outside."""
    max_per_sample: int | None = Field(None, gt=0)
    """The most images one row may carry; default: the model family's limit where it has one (LLaVA 1.5 and
    PaliGemma: 1), else no limit."""


class EvalSplit(Section):
    split: float = Field(gt=0.0, lt=1.0)
    """Fraction of the training rows held out for evaluation."""


class DataSection(Section):
    train: list[DataSource] = Field(min_length=1)
    """Training sources, mixed."""
    eval: EvalSplit | list[DataSource] | None = None
    """Eval data: `{split: 0.05}` of train, or a list of sources like `train`."""
    max_seq_length: int | None = Field(None, gt=0)
    """Truncate (and pack) to this many tokens; for preference data, prompt + completion. Unset: rows are not
    truncated, and `ftune plan` sizes activations for the longest tokenized row of the local data (docs/plan.md)."""
    max_prompt_length: int | None = Field(None, gt=0)
    """Preference data: keep at most this many prompt tokens (the end of the prompt, next to the completion)."""
    packing: bool = False
    """Pack several samples into each row; attention never crosses a sample boundary."""
    train_on: Literal["completion", "all"] = "completion"
    """Which tokens carry loss: only responses (every assistant turn for chat) or everything."""
    shuffle: bool = True
    """Shuffle the training rows (seeded by train.seed)."""
    mix: Literal["concat", "interleave"] = "concat"
    """How several training sources combine: `concat` (each resampled to its `weight` share of all rows, or taken
    whole without weights) or `interleave` (each sample drawn from a source with probability weight/Σweights, seeded
    by train.seed, as `datasets.interleave_datasets`). `ftune data` reports the realised mix."""
    mix_stopping: Literal["first_exhausted", "all_exhausted"] = "first_exhausted"
    """`interleave`: stop when the first source runs out, or when every source has been seen whole (the others
    repeat)."""
    chat_template: str | None = None
    """Chat template for `chat` rows and `as_chat` sources: a built-in name (llama3, chatml, mistral, gemma, phi3,
    qwen, qwen3, alpaca, hermes: ChatML with tool calls), a Jinja string, or unset for the tokenizer's own (ftune's default when it has none)."""
    streaming: bool = False
    """Read, tokenize and pack the training rows while training runs (a `datasets.IterableDataset`), with no cache
    and no pass over the data first: for data too large to preprocess. Needs `train.max_steps`; several processes
    split the files of each source (use at least as many files as processes)."""
    max_dropped_fraction: float = Field(0.1, ge=0.0, le=1.0)
    """Error when more than this fraction of samples has no trainable token after truncation."""
    num_proc: int | None = Field(None, gt=0)
    """Processes for preprocessing; default: one."""
    cache_dir: str | None = None
    """Where preprocessed data is cached; default: ~/.cache/ftune/data (FTUNE_CACHE overrides)."""
    images: ImageSettings = Field(default_factory=ImageSettings)
    """`vision-chat` sources: image size limits and resizing."""


# --------------------------------------------------------------------------------------- quantization
class QatSection(Section):
    """Quantization-aware training (torchao): the linear layers train through fake quantization, so the weights
    learn to survive the scheme `ftune merge` then quantizes them to for real (docs/quantization.md)."""

    scheme: Literal["int4-weight", "int8-dynamic-act-int4-weight", "fp8"]
    """int4-weight: int4 weights (symmetric, one scale per group of `group_size` inputs); int8-dynamic-act-int4-weight:
    the same weights with int8 activations quantized per token at run time; fp8: float8 (e4m3) weights and
    activations per row, only on GPUs with FP8 (compute capability 8.9+)."""
    group_size: int = Field(32, gt=0)
    """Inputs sharing one int4 weight scale (a power of two dividing every quantized layer's input size); smaller
    is more accurate and larger on disk. Not used by fp8."""
    start_after_steps: int = Field(0, ge=0)
    """Train this many steps unquantized first, then turn fake quantization on (0: from the first step)."""


class QuantizationSection(Section):
    bits: Literal[4, 8] | None = None
    """Load the base model in 4-bit (QLoRA) or 8-bit (bitsandbytes). Not with `qat`."""
    qat: QatSection | None = None
    """Train through fake quantization and export the truly quantized model (torchao); not with `bits`."""
    type: Literal["nf4", "fp4"] = "nf4"
    """4-bit data type."""
    double_quant: bool = False
    """Quantize the quantization constants too (4-bit only)."""
    compute_dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    """Dtype of the matmuls on dequantized weights."""
    quant_storage: Literal["uint8", "float32", "bfloat16", "float16"] = "uint8"
    """Storage dtype of packed 4-bit weights; for FSDP+QLoRA it must equal model.dtype."""
    skip_modules: list[str] | None = None
    """Modules left unquantized (e.g. lm_head)."""
    upcast_non_quantized: bool | None = None
    """k-bit preparation upcasts the unquantized weights (embeddings, norms, head) to fp32, as peft does; false
    keeps them in the loaded dtype (less memory). Default: peft's upcast, except under FSDP (one dtype per shard)."""


# ---------------------------------------------------------------------------------------- distributed
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


# ----------------------------------------------------------------------------------------------- train
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
    advantages zero: nothing to learn) or every completion is clipped at max_completion_length."""
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
    per_device_batch_size: int = Field(1, ge=1)
    """Samples (rows) per device per forward."""
    gradient_accumulation_steps: int = Field(1, ge=1)
    """Forwards accumulated per optimizer step."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory."""
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
    """Move activations saved for backward to CPU memory during forward and back for backward (long context)."""
    callbacks: list[CallbackSpec] = Field(default_factory=list)
    """Trainer callbacks registered by installed plugins, by name (a recipe never names code)."""


class GenerateEval(Section):
    max_new_tokens: int = Field(64, gt=0)
    """Longest greedy completion per eval row."""
    metrics: list[Literal["exact_match", "f1"]] | None = Field(None, min_length=1)
    """`exact_match` (the whole completion equals the reference, case and spacing aside) and `f1` (word overlap).
    Unset: both for instruction data (short, closed answers), `f1` alone for chat data (free-form answers rarely
    match a reference exactly)."""
    max_samples: int | None = Field(200, gt=0)
    """Eval rows to generate for (null: all)."""


class BenchmarksEval(Section):
    """Standard benchmarks through EleutherAI's lm-eval harness (`pip install "ftune[eval]"`), run on the model in
    memory (adapters active, no merge) and offline: local task YAMLs come from `include` folders (docs/evaluation.md)."""

    tasks: list[str] = Field(min_length=1)
    """lm-eval task or group names: the installed harness's (e.g. arc_easy) or those the `include` folders define."""
    include: list[str] = []
    """Folders of local lm-eval task YAMLs (their `task:` names join the harness's); relative to the recipe file."""
    num_fewshot: int | None = Field(None, ge=0)
    """Few-shot examples per prompt; unset: each task's own default."""
    limit: int | None = Field(None, gt=0)
    """Rows evaluated per task (the first N); unset: every row."""
    at: list[Literal["start", "end", "steps"]] = Field(default_factory=lambda: ["start", "end"], min_length=1)
    """When `ftune run` measures: `start` (the base model, before step 1), `end` (after the last step) and `steps`
    (at each eval of eval.strategy). Results go to metrics.jsonl as `bench/<task>/<metric>` and to summary.json."""


class EvalSection(Section):
    strategy: Literal["no", "steps", "epoch"] = "no"
    """When to evaluate."""
    steps: int | None = Field(None, gt=0)
    """Evaluate every N steps (strategy: steps)."""
    batch_size: int | None = Field(None, gt=0)
    """Eval batch size per device; default: train.per_device_batch_size."""
    on_start: bool = False
    """Also evaluate before the first step, so metrics.jsonl holds the starting eval loss."""
    generate: GenerateEval | None = None
    """Evaluation by generation: greedy completions of the eval prompts scored against the reference answers
    (instruction and chat data), reported by `ftune eval` and at the end of `ftune run` (into metrics.jsonl)."""
    per_epoch: int | None = Field(None, ge=1)
    """Evaluate N times per epoch, evenly (instead of `strategy`/`steps`; needs `train.epochs`)."""
    benchmarks: BenchmarksEval | None = None
    """lm-eval harness benchmarks on the live model at the start, the end and/or each eval step of a run, and by
    `ftune eval --benchmarks` on a finished one."""


class CheckpointSection(Section):
    strategy: Literal["no", "steps", "epoch"] = "steps"
    """When to save checkpoints."""
    steps: int = Field(500, gt=0)
    """Save every N steps (strategy: steps)."""
    keep: int | None = Field(3, ge=1)
    """Keep at most N checkpoints (null keeps all)."""
    resume: Literal["auto"] | bool | str = "auto"
    """`auto`: continue from the latest complete checkpoint in the run dir; a checkpoint path; or false."""
    load_best: bool = False
    """Load the best checkpoint (by early_stopping.metric or eval_loss) at the end."""
    per_epoch: int | None = Field(None, ge=1)
    """Save N checkpoints per epoch, evenly (instead of `strategy`/`steps`; needs `train.epochs`)."""


class WandbSettings(Section):
    """Weights & Biases settings, passed as its environment variables (WANDB_*); used only when report_to has wandb."""

    project: str | None = None
    """WANDB_PROJECT."""
    entity: str | None = None
    """WANDB_ENTITY: the team or user that owns the project."""
    run_name: str | None = None
    """The run's name (TrainingArguments.run_name, shared with MLflow); default: the recipe's name."""
    tags: list[str] | None = None
    """WANDB_TAGS."""
    group: str | None = None
    """WANDB_RUN_GROUP."""
    mode: Literal["online", "offline"] | None = None
    """WANDB_MODE: `offline` keeps the run on this machine (sync it later)."""


class MlflowSettings(Section):
    """MLflow settings, passed as its environment variables (MLFLOW_*); used only when report_to has mlflow."""

    tracking_uri: str | None = None
    """MLFLOW_TRACKING_URI: a server URL or a local folder (file:...); default: ./mlruns."""
    experiment: str | None = None
    """MLFLOW_EXPERIMENT_NAME."""
    run_name: str | None = None
    """The run's name (TrainingArguments.run_name, shared with W&B); default: the recipe's name."""
    tags: dict[str, str] | None = None
    """MLFLOW_TAGS: run tags as name: value."""


class Trackers(Section):
    """Settings of the experiment trackers named in output.report_to."""

    wandb: WandbSettings | None = None
    """Weights & Biases."""
    mlflow: MlflowSettings | None = None
    """MLflow."""


class OutputSection(Section):
    dir: str | None = None
    """Run directory, relative to the working directory; default: runs/<name>."""
    report_to: list[Literal[TRACKER_NAMES]] = Field(default_factory=lambda: ["tensorboard"])  # type: ignore[valid-type]
    """Experiment trackers (the ones transformers reports to; each needs its package, checked before launch);
    metrics.jsonl is always written. Offline modes: docs/trackers.md."""
    overwrite: bool = False
    """Allow starting over in a run dir that holds a finished run."""
    loss_curve: bool = True
    """Write loss_curve.png at the end."""
    report: bool = False
    """Write report.html in the run dir (curves, predictions, recipe, plan: `ftune report`) and refresh it at each
    log, so a live run can be watched from a browser; `ftune report RUN_DIR` writes it for any run."""
    trackers: Trackers | None = None
    """Tracker settings (W&B project/entity/run name/tags, MLflow experiment/tags); nothing is sent unless the
    tracker is also in report_to."""


PeftSection = Annotated[Union[tuple(config_classes())], Field(discriminator="method")]  # noqa: UP007


class Recipe(Section):
    """A fine-tuning recipe."""

    schema_version: int = SCHEMA_VERSION
    """Recipe format version; this ftune reads version 1."""
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """Run name; letters, digits, '.', '_' and '-'."""
    description: str | None = None
    """Free text."""
    extends: str | list[str] | None = None
    """Base recipe(s) to start from, relative to this file; deep-merged in order, lists replaced."""
    model: ModelSection
    """What is fine-tuned."""
    data: DataSection
    """What it is trained on."""
    peft: PeftSection = Field(default_factory=lambda: config_classes()[0]())  # type: ignore[valid-type]
    """Fine-tuning method: lora | prefix | llama-adapter | full | freeze."""
    quantization: QuantizationSection | None = None
    """Load the base quantized with bitsandbytes (QLoRA: `bits`), or train quantization-aware (`qat`, torchao)."""
    distributed: DistributedSection = Field(default_factory=DistributedSection)
    """Processes, machines and sharding."""
    train: TrainSection = Field(default_factory=TrainSection)
    """Optimisation."""
    eval: EvalSection = Field(default_factory=EvalSection)
    """Evaluation during training."""
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    """Checkpoints and resume."""
    output: OutputSection = Field(default_factory=OutputSection)
    """Where results go."""

    @property
    def kbit(self) -> QuantizationSection | None:
        """The bitsandbytes-quantized base (`quantization.bits`); None without one, a QAT-only section too."""
        q = self.quantization
        return q if q is not None and q.bits is not None else None

    @property
    def qat(self) -> QatSection | None:
        """Quantization-aware training (`quantization.qat`), or None."""
        return self.quantization.qat if self.quantization is not None else None
