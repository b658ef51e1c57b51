"""Axolotl config (one flat YAML: base_model, datasets, adapter, lora_*, micro_batch_size, ...) → ftune recipe.

Facts about Axolotl's keys are from its documented config reference; the table is documented in docs/import.md.
"""

from __future__ import annotations

from typing import Any

from ftune.importers._core import (
    NOTHING,
    ChangesBehaviour,
    Context,
    Key,
    PeerPath,
    Skip,
    Unmappable,
    build,
    run_name,
)
from ftune.importers._values import (
    adam_setting,
    continue_adapter,
    as_bool,
    attn_implementation,
    as_float,
    as_int,
    choose,
    deepspeed_from_file,
    fsdp_config_table,
    fsdp_version,
    hf_fsdp_options,
    hf_optimizer,
    hf_scheduler,
    report_to_wandb,
)

PEER = "axolotl"
UNKNOWN = "no ftune key for this axolotl option"


# ------------------------------------------------------------------------------------------ datasets
def _roles(value: Any, ctx: Context, path: PeerPath) -> dict[str, str]:
    """axolotl `roles: {user: [human], assistant: [gpt]}` (target → source names) → ftune `roles` (source → target)."""
    if not isinstance(value, dict):
        raise Unmappable("expected a mapping of role → source names")
    out = {}
    for target, sources in value.items():
        if target not in ("system", "user", "assistant", "tool"):
            ctx.skip((*path, target), f"role {target!r} is not one ftune renders (system, user, assistant, tool)")
            continue
        for source in sources if isinstance(sources, list) else [sources]:
            if str(source) != target:
                out[str(source)] = target
    return out


def source(entry: dict, ctx: Context, path: PeerPath) -> dict | None:
    """One axolotl dataset entry → an ftune data source (None when its type has no ftune format)."""
    from ftune.hub import looks_local

    kind = entry.get("type")
    if "path" not in entry:
        ctx.skip(path, "a dataset without `path` can't be imported")
        return None
    out: dict[str, Any] = {"path": str(entry["path"])}
    fields: dict[str, str] = {}
    handled = {"path", "type"}
    if isinstance(kind, dict):  # a custom instruction format: field_instruction, field_output, format, ...
        out["format"] = "instruction"
        for peer_key, ftune_key in (("field_instruction", "instruction"), ("field_input", "input"),
                                    ("field_output", "output")):
            if peer_key in kind:
                fields[ftune_key] = str(kind[peer_key])
        if "format" in kind:
            out["template"] = str(kind["format"])
        for key in kind:
            if key not in ("field_instruction", "field_input", "field_output", "format"):
                ctx.skip((*path, "type", key), "no ftune equivalent in a custom instruction format "
                         "(ftune's template has one form, with {instruction} and {input})")
    elif kind == "alpaca":
        out["format"] = "instruction"
    elif kind == "completion":
        out["format"] = "text"
        if "field" in entry:
            fields["text"] = str(entry["field"])
        handled.add("field")
    elif kind == "sharegpt":
        out["format"] = "chat"
        fields.update(messages="conversations", role="from", content="value")
    elif kind == "chat_template":
        out["format"] = "chat"
        fields["messages"] = str(entry.get("field_messages", "messages"))
        mapping = entry.get("message_property_mappings") or {}
        role = mapping.get("role", entry.get("message_field_role", "role"))
        content = mapping.get("content", entry.get("message_field_content", "content"))
        fields.update(role=str(role), content=str(content))
        handled |= {"field_messages", "message_property_mappings", "message_field_role", "message_field_content"}
        for key in mapping:
            if key not in ("role", "content"):
                ctx.skip((*path, "message_property_mappings", key), "ftune reads only a message's role and content")
        if "roles" in entry:
            roles = _roles(entry["roles"], ctx, (*path, "roles"))
            if roles:
                out["roles"] = roles
            handled.add("roles")
        if "roles_to_train" in entry:
            handled.add("roles_to_train")
            if sorted(entry["roles_to_train"] or []) != ["assistant"]:
                ctx.skip((*path, "roles_to_train"), "ftune trains every assistant turn (data.train_on: completion) "
                         "or every token (all); it can't pick other roles")
    elif ctx.config.get("rl") and isinstance(kind, str) and kind.partition(".")[2] in RL_TYPES:
        template, _, strategy = kind.partition(".")
        out["format"] = "preference"
        fields.update(RL_TYPES[strategy])
        ctx.skip((*path, "type"), f"{kind!r} renders the prompt through axolotl's {template} template; ftune's "
                 "preference format reads string prompts and completions as plain text (list-of-messages rows "
                 "go through data.chat_template)", changes=True)
    else:
        ctx.skip((*path, "type"), f"dataset type {kind!r} has no ftune data format "
                 "(imported: alpaca, completion, sharegpt, chat_template, custom instruction formats)")
        return None
    if fields:
        defaults = {"messages": "messages", "role": "role", "content": "content", "text": "text",
                    "instruction": "instruction", "input": "input", "output": "output", "prompt": "prompt",
                    "chosen": "chosen", "rejected": "rejected"}
        fields = {k: v for k, v in fields.items() if defaults[k] != v}
        if fields:
            out["fields"] = fields
    for key, value in entry.items():
        if key in handled:
            continue
        here = (*path, key)
        if key == "split":
            out["split"] = str(value)
        elif key == "ds_type":
            if value not in ("json", "csv", "parquet", "text"):
                ctx.skip(here, f"ds_type {value!r} has no ftune loader")
            else:
                out["type"] = value
        elif key == "data_files" and looks_local(str(entry["path"])) is False:
            ctx.skip(here, "ftune reads a whole hub dataset (by split), not chosen files of it")
        elif key == "data_files":
            files = value if isinstance(value, list) else [value]
            if len(files) == 1:
                out["path"] = str(files[0])
            else:
                ctx.skip(here, "an ftune source is one file: list one source per file under data.train")
        elif key == "chat_template":
            ctx.skip(here, "a per-dataset chat template: ftune has one for all data (data.chat_template, Jinja text)")
        elif key == "name":
            ctx.skip(here, "ftune's hub loader has no dataset config name; save the config to disk and use its folder")
        elif value not in (None, False):
            ctx.skip(here, "no ftune equivalent for this dataset option")
    if "type" not in out and not looks_local(out["path"]):
        out["type"] = "hub"
        ctx.note((*path, "path"), f"{out['path']!r} is read as a hub dataset (type: hub); "
                 "a hub must be reachable, or download it and give the local path")
    return out


def sources(value: Any, ctx: Context, path: PeerPath) -> list[dict]:
    if not isinstance(value, list):
        raise Unmappable("expected a list of datasets")
    out = []
    for i, entry in enumerate(value):
        if not isinstance(entry, dict):
            ctx.skip((*path, i), "expected a dataset mapping (path, type, ...)")
            continue
        converted = source(entry, ctx, (*path, i))
        if converted is not None:
            out.append(converted)
    if not out:
        raise Unmappable("no dataset could be imported; ftune needs at least one under data.train")
    return out


def val_set_size(value: Any, ctx: Context, path: PeerPath) -> Any:
    size = as_float(value)
    if size == 0:
        return NOTHING
    if not 0 < size < 1:
        raise Unmappable(f"a held-out count ({value}) : ftune holds out a fraction (data.eval.split)")
    return {"split": size}


# ---------------------------------------------------------------------------------------- the model
# axolotl's DPO prompt strategies (`type: chatml.intel`, `llama3.argilla`, ...) -> the columns they read
RL_TYPES = {
    "intel": {"prompt": "question", "chosen": "chosen", "rejected": "rejected"},
    "prompt_pairs": {"prompt": "prompt", "chosen": "chosen", "rejected": "rejected"},
    "argilla": {"prompt": "instruction", "chosen": "chosen_response", "rejected": "rejected_response"},
}
RL_OBJECTIVES = {"dpo": "dpo", "ipo": "dpo", "orpo": "orpo", "kto": "kto", "simpo": "simpo"}


def rl(value: Any, ctx: Context, path: PeerPath) -> Any:
    """axolotl `rl:` -> train.objective (ipo is DPO with loss_type ipo); others (grpo, ...) are refused: any recipe
    would train something else."""
    if value not in RL_OBJECTIVES:
        ctx.refuse(path, f"rl {value!r} has no ftune objective (ftune trains {', '.join(RL_OBJECTIVES)})",
                   "write the recipe by hand if an ftune objective fits")
    if value == "ipo":
        ctx.set("train.preference.loss_type", "ipo")
    return RL_OBJECTIVES[value]


LIGER_PLUGIN = "axolotl.integrations.liger.LigerPlugin"
LIGER_FLAGS = ("liger_rope", "liger_rms_norm", "liger_glu_activation", "liger_fused_linear_cross_entropy")


def plugins(value: Any, ctx: Context, path: PeerPath) -> Any:
    """The Liger plugin -> train.kernels: liger (ftune applies RMSNorm, RoPE, SwiGLU and the fused linear
    cross-entropy together); other plugins are code."""
    names = [str(v) for v in (value if isinstance(value, list) else [value])]
    for i, name in enumerate(names):
        if name == LIGER_PLUGIN or name.endswith(".LigerPlugin"):
            off = [f for f in LIGER_FLAGS if ctx.config.get(f) is False]
            if off:
                ctx.note(path, f"train.kernels: liger applies every Liger kernel; the config turns off {', '.join(off)}")
            ctx.set("train.kernels", "liger")
        else:
            ctx.skip((*path, i), "an axolotl plugin is code; ftune's extensions are installed plugins (ftune.plugins)")
    return NOTHING


def compile_flag(value: Any, ctx: Context, path: PeerPath) -> Any:
    return True if value == "auto" else as_bool(value)


def eval_sample_packing(value: Any, ctx: Context, path: PeerPath) -> Any:
    if as_bool(value) or not ctx.config.get("sample_packing"):
        return NOTHING
    raise Unmappable("ftune packs eval rows like train rows (data.packing); the eval loss is the same, batched "
                     "differently")


def adapter(value: Any, ctx: Context, path: PeerPath) -> Any:
    if value in ("lora", "qlora"):
        ctx.set("peft.method", "lora")
        return NOTHING
    raise Unmappable(f"adapter {value!r}: ftune imports lora and qlora (a config without adapter is full fine-tuning)")


def target_modules(value: Any, ctx: Context, path: PeerPath) -> Any:
    if ctx.config.get("lora_target_linear"):
        return NOTHING  # all-linear wins, as in axolotl
    return [value] if isinstance(value, str) else list(value)


def precision(kind: str):
    dtype = {"bf16": "bfloat16", "fp16": "float16"}[kind]

    def translate(value: Any, ctx: Context, path: PeerPath) -> Any:
        if value == "auto":
            ctx.note(path, f"`{kind}: auto` imported as {kind} (ftune has no auto precision)")
        elif not as_bool(value):
            return NOTHING
        ctx.set("train.mixed_precision", kind)
        ctx.set("model.dtype", dtype)  # axolotl loads the weights in this dtype too
        return NOTHING

    return translate


def load_dtype(dtype: str):
    def translate(value: Any, ctx: Context, path: PeerPath) -> Any:
        return dtype if as_bool(value) else NOTHING

    return translate


def attention(impl: str):
    def translate(value: Any, ctx: Context, path: PeerPath) -> Any:
        return impl if as_bool(value) else NOTHING

    return translate


def quant_bits(bits: int):
    def translate(value: Any, ctx: Context, path: PeerPath) -> Any:
        if not as_bool(value):
            return NOTHING
        ctx.set("quantization.bits", bits)
        if bits == 4:  # axolotl's QLoRA defaults
            ctx.set("quantization.type", "nf4")
            ctx.set("quantization.double_quant", True)
        return NOTHING

    return translate


def bnb_kwargs(value: Any, ctx: Context, path: PeerPath) -> Any:
    if not isinstance(value, dict):
        raise Unmappable("expected a mapping of BitsAndBytesConfig arguments")
    for key, v in value.items():
        if key == "bnb_4bit_quant_type" and v in ("nf4", "fp4"):
            ctx.set("quantization.type", v)
        elif key == "bnb_4bit_use_double_quant":
            ctx.set("quantization.double_quant", as_bool(v))
        elif key == "llm_int8_skip_modules":
            ctx.set("quantization.skip_modules", list(v))
        else:
            ctx.skip((*path, key), "no ftune quantization key for this BitsAndBytesConfig argument")
    return NOTHING


# ----------------------------------------------------------------------------------- schedules
def every_n_steps(section: str, verb: str):
    """`eval_steps` / `save_steps`: every N steps (a fraction of the total steps has no ftune equivalent)."""
    def translate(value: Any, ctx: Context, path: PeerPath) -> Any:
        steps = as_float(value)
        if steps < 1:
            raise Unmappable(f"a fraction of the total steps: ftune {verb} every N steps ({section}.steps)")
        ctx.set(f"{section}.strategy", "steps")
        ctx.set(f"{section}.steps", int(steps))
        return NOTHING

    return translate


def per_epoch(section: str):
    def translate(value: Any, ctx: Context, path: PeerPath) -> Any:
        ctx.set(f"{section}.per_epoch", as_int(value))
        return NOTHING

    return translate


def wandb_setting(key: str):
    """wandb_project / _entity / _name / _mode -> output.trackers.wandb.*, and report to wandb."""

    def translate(value: Any, ctx: Context, path: PeerPath) -> Any:
        if key == "mode" and value not in ("online", "offline"):
            raise Unmappable(f"W&B mode {value!r}: ftune sets online or offline (report_to decides whether at all)")
        report_to_wandb(ctx)
        ctx.set(f"output.trackers.wandb.{key}", str(value))
        return NOTHING

    return translate


def _wandb_env(var: str):
    def translate(value: Any, ctx: Context, path: PeerPath) -> Any:
        raise Unmappable(f"no ftune key; export {var}={value}")

    return translate


SPECIAL = ("pad_token", "eos_token", "bos_token", "unk_token")


def special_token(value: Any, ctx: Context, path: PeerPath) -> Any:
    if path[-1] not in SPECIAL:
        raise Unmappable(f"ftune sets {', '.join(SPECIAL)} (model.special_tokens), not {path[-1]}")
    ctx.set(f"model.special_tokens.{path[-1]}", str(value))
    return NOTHING

TABLE: dict[str, Key | Skip] = {
    # model
    "base_model": Key("model.path"),
    "base_model_config": Skip("ftune reads the model config from model.path"),
    "revision_of_model": Key("model.revision"),
    "tokenizer_config": Key("model.tokenizer"),
    "model_type": Skip("ftune picks the model class from model.task (causal-lm)"),
    "tokenizer_type": Skip("ftune loads the tokenizer with AutoTokenizer"),
    "trust_remote_code": Key("model.trust_remote_code", lambda v, c, p: as_bool(v)),
    "flash_attention": Key("model.attn_implementation", attention("flash_attention_2")),
    "sdp_attention": Key("model.attn_implementation", attention("sdpa")),
    "eager_attention": Key("model.attn_implementation", attention("eager")),
    "attn_implementation": Key("model.attn_implementation", attn_implementation),
    "xformers_attention": Skip("ftune has no xformers attention; model.attn_implementation takes eager, sdpa, "
                               "flash_attention_2 or flex_attention"),
    "bf16": Key(None, precision("bf16")),
    "fp16": Key(None, precision("fp16")),
    "bfloat16": Key("model.dtype", load_dtype("bfloat16")),
    "float16": Key("model.dtype", load_dtype("float16")),
    "tf32": Skip("ftune has no TF32 switch (torch's default matmul precision is used)", changes=True),
    "special_tokens.*": Key(None, special_token),
    "tokens": Key("model.add_tokens", lambda v, c, p: [str(t) for t in (v if isinstance(v, list) else [v])]),
    # adapter and quantization
    "adapter": Key(None, adapter),
    "load_in_8bit": Key(None, quant_bits(8)),
    "load_in_4bit": Key(None, quant_bits(4)),
    "bnb_config_kwargs": Key(None, bnb_kwargs),
    "lora_r": Key("peft.r", lambda v, c, p: as_int(v)),
    "lora_alpha": Key("peft.alpha", lambda v, c, p: as_float(v)),
    "lora_dropout": Key("peft.dropout", lambda v, c, p: as_float(v)),
    "lora_target_modules": Key("peft.target_modules", target_modules),
    "lora_target_linear": Key("peft.target_modules", lambda v, c, p: "all-linear" if as_bool(v) else NOTHING),
    "lora_modules_to_save": Key("peft.modules_to_save", lambda v, c, p: list(v)),
    "peft_use_dora": Key("peft.use_dora", lambda v, c, p: as_bool(v)),
    "peft_use_rslora": Key("peft.use_rslora", lambda v, c, p: as_bool(v)),
    "lora_fan_in_fan_out": Skip("ftune has no fan_in_fan_out switch (peft detects Conv1D layers)"),
    "lora_model_dir": Key(None, lambda v, c, p: NOTHING),  # model.path at the adapter (finish: continue_adapter)
    # data
    "datasets": Key("data.train", sources),
    "test_datasets": Key("data.eval", sources),
    "val_set_size": Key("data.eval", val_set_size),
    "sequence_len": Key("data.max_seq_length", lambda v, c, p: as_int(v)),
    "sample_packing": Key("data.packing", lambda v, c, p: as_bool(v)),
    "eval_sample_packing": Key(None, eval_sample_packing),
    "pad_to_sequence_len": Skip("ftune pads each batch to its longest row (packed rows are full anyway)"),
    "train_on_inputs": Key("data.train_on", lambda v, c, p: "all" if as_bool(v) else "completion"),
    "chat_template": Key("data.chat_template", lambda v, c, p: _template_name(v)),
    "chat_template_jinja": Key("data.chat_template"),
    "dataset_prepared_path": Key("data.cache_dir"),
    "dataset_processes": Key("data.num_proc", lambda v, c, p: as_int(v)),
    "shuffle_merged_datasets": Key("data.shuffle", lambda v, c, p: as_bool(v)),
    "group_by_length": Key("train.group_by_length", lambda v, c, p: as_bool(v)),
    "rl": Key("train.objective", rl),
    "rl_beta": Key("train.preference.beta", lambda v, c, p: as_float(v)),
    "dpo_beta": Key("train.preference.beta", lambda v, c, p: as_float(v)),
    "orpo_alpha": Key("train.preference.beta", lambda v, c, p: as_float(v)),
    "simpo_gamma": Key("train.preference.gamma", lambda v, c, p: as_float(v)),
    "dpo_label_smoothing": Key("train.preference.label_smoothing", lambda v, c, p: as_float(v) or NOTHING),
    "kto_desirable_weight": Key("train.preference.desirable_weight", lambda v, c, p: as_float(v)),
    "kto_undesirable_weight": Key("train.preference.undesirable_weight", lambda v, c, p: as_float(v)),
    "plugins": Key(None, plugins),
    **{flag: Key(None, lambda v, c, p: NOTHING) for flag in LIGER_FLAGS},  # read with plugins
    "torch_compile": Key("train.compile", lambda v, c, p: compile_flag(v, c, p)),
    "torch_compile_backend": Key("train.compile_backend", choose({"inductor": "inductor", "aot_eager": "aot_eager",
                                                                  "cudagraphs": "cudagraphs"}, "compile backend")),
    "activation_offloading": Key("train.activation_offloading", lambda v, c, p: v == "legacy" or as_bool(v)),
    "tiled_mlp": Key("train.tiled_mlp", lambda v, c, p: as_bool(v)),
    "tiled_mlp_num_shards": Key("train.tiled_mlp_shards", lambda v, c, p: as_int(v)),
    "tiled_mlp_use_original_mlp": Skip("ftune's tiled MLP always slices the model's own MLP forward (Liger's with "
                                       "train.kernels: liger)"),
    "dataloader_num_workers": Key("train.dataloader.workers", lambda v, c, p: as_int(v)),
    "dataloader_prefetch_factor": Key("train.dataloader.prefetch_factor", lambda v, c, p: as_int(v)),
    "dataloader_pin_memory": Key("train.dataloader.pin_memory", lambda v, c, p: as_bool(v)),
    "adam_beta1": Key(None, adam_setting("beta1")),
    "adam_beta2": Key(None, adam_setting("beta2")),
    "adam_epsilon": Key(None, adam_setting("eps")),
    # optimisation
    "micro_batch_size": Key("train.per_device_batch_size", lambda v, c, p: as_int(v)),
    "eval_batch_size": Key("eval.batch_size", lambda v, c, p: as_int(v)),
    "gradient_accumulation_steps": Key("train.gradient_accumulation_steps", lambda v, c, p: as_int(v)),
    "num_epochs": Key("train.epochs", lambda v, c, p: as_float(v)),
    "max_steps": Key("train.max_steps", lambda v, c, p: as_int(v)),
    "learning_rate": Key("train.learning_rate", lambda v, c, p: as_float(v)),
    "lr_scheduler": Key("train.lr_scheduler", hf_scheduler),
    # with `lr_scheduler: cosine`, axolotl floors the rate at ratio x lr: transformers' cosine_with_min_lr (finish)
    "cosine_min_lr_ratio": Key("train.lr_scheduler_args.min_lr_rate", lambda v, c, p: as_float(v)),
    "warmup_steps": Key("train.warmup_steps", lambda v, c, p: as_int(v)),
    "warmup_ratio": Key("train.warmup_ratio", lambda v, c, p: as_float(v)),
    "weight_decay": Key("train.weight_decay", lambda v, c, p: as_float(v)),
    "max_grad_norm": Key("train.max_grad_norm", lambda v, c, p: as_float(v)),
    "optimizer": Key("train.optimizer", hf_optimizer),
    "gradient_checkpointing": Key("train.gradient_checkpointing", lambda v, c, p: v is True or v in ("unsloth", "offload")),
    "gradient_checkpointing_kwargs": Skip("train.gradient_checkpointing is a switch: ftune always checkpoints "
                                          "with use_reentrant: false"),
    "seed": Key("train.seed", lambda v, c, p: as_int(v)),
    "logging_steps": Key("train.logging_steps", lambda v, c, p: as_int(v)),
    "neftune_noise_alpha": Key("train.neftune_alpha", lambda v, c, p: as_float(v)),
    "early_stopping_patience": Key("train.early_stopping.patience", lambda v, c, p: as_int(v)),
    # distributed
    "fsdp": Key(None, hf_fsdp_options),
    "fsdp_version": Key(None, fsdp_version),
    **fsdp_config_table(("fsdp_config.",)),
    "deepspeed": Key(None, deepspeed_from_file),
    "ddp_timeout": Key("distributed.timeout", lambda v, c, p: as_int(v)),
    # eval and checkpoints
    "eval_steps": Key(None, every_n_steps("eval", "evaluates")),
    "evals_per_epoch": Key(None, per_epoch("eval")),
    "save_steps": Key(None, every_n_steps("checkpoint", "saves")),
    "saves_per_epoch": Key(None, per_epoch("checkpoint")),
    "save_strategy": Key("checkpoint.strategy", choose({"steps": "steps", "epoch": "epoch", "no": "no"}, "save strategy")),
    "save_total_limit": Key("checkpoint.keep", lambda v, c, p: as_int(v)),
    "load_best_model_at_end": Key("checkpoint.load_best", lambda v, c, p: as_bool(v)),
    "resume_from_checkpoint": Key("checkpoint.resume", lambda v, c, p: str(v)),
    "auto_resume_from_checkpoints": Key("checkpoint.resume", lambda v, c, p: "auto" if as_bool(v) else False),
    "output_dir": Key("output.dir"),
    # tracking
    "wandb_project": Key(None, wandb_setting("project")),
    "wandb_entity": Key(None, wandb_setting("entity")),
    "wandb_name": Key(None, wandb_setting("run_name")),
    "wandb_run_id": Key(None, _wandb_env("WANDB_RUN_ID")),
    "wandb_log_model": Key(None, _wandb_env("WANDB_LOG_MODEL")),
    "wandb_watch": Key(None, _wandb_env("WANDB_WATCH")),
    "wandb_mode": Key(None, wandb_setting("mode")),
    "use_tensorboard": Key("output.report_to", lambda v, c, p: ["tensorboard"] if as_bool(v) else NOTHING),
    # axolotl's own switches
    "strict": Skip("ftune is always strict: an unknown recipe key is an error"),
    "hub_model_id": Skip("ftune doesn't push to the hub"),
    "hub_strategy": Skip("ftune doesn't push to the hub"),
    "debug": Skip("ftune has no debug switch in the recipe (`ftune data RECIPE` shows the data)"),
}


# axolotl's template names -> ftune's built-in ones (same turn format)
TEMPLATE_NAMES = {"chatml": "chatml", "llama3": "llama3", "mistral_v1": "mistral", "mistral_v2v3": "mistral",
                  "gemma": "gemma", "gemma3": "gemma", "phi_3": "phi3", "qwen_25": "qwen", "alpaca": "alpaca"}


def _template_name(value: Any) -> Any:
    if value == "tokenizer_default":
        return NOTHING  # ftune's default: the tokenizer's own template
    if isinstance(value, str) and ("{%" in value or "{{" in value):
        return value
    if value in TEMPLATE_NAMES:
        return TEMPLATE_NAMES[value]
    raise ChangesBehaviour(f"{value!r} is an axolotl template name with no ftune built-in (ftune has "
                     f"{', '.join(sorted(set(TEMPLATE_NAMES.values())))}); data.chat_template also takes Jinja text")


def finish(ctx: Context) -> None:
    c = ctx.config
    continue_adapter(ctx, "lora_model_dir")
    if ctx.get("train.lr_scheduler_args.min_lr_rate") is not None and ctx.get("train.lr_scheduler", "cosine") == "cosine":
        ctx.set("train.lr_scheduler", "cosine_with_min_lr")
    ctx.out.setdefault("name", run_name(c.get("output_dir"), ctx.file.stem))
    if "peft" not in ctx.out:
        ctx.set("peft.method", "full")  # no adapter: axolotl fine-tunes every weight
    if ctx.get("quantization.bits") is not None:
        ctx.set("quantization.compute_dtype", {"float16": "float16"}.get(ctx.get("model.dtype"), "bfloat16"))
        if ctx.get("quantization.bits") == 8:  # 4-bit-only options are refused with bits 8
            for key in ("type", "double_quant"):
                ctx.out["quantization"].pop(key, None)
            ctx.out["quantization"].pop("compute_dtype", None)
    for section in ("eval", "checkpoint"):  # per_epoch counts epochs; axolotl also allows it with max_steps
        n = ctx.get(f"{section}.per_epoch")
        if n is not None and ctx.get("train.max_steps") is not None:
            ctx.out[section].pop("per_epoch")
            if n == 1:
                ctx.set(f"{section}.strategy", "epoch")
            else:
                ctx.note(None, f"{section}s_per_epoch: {n} with max_steps: ftune's {section}.per_epoch needs "
                               f"train.epochs; set {section}.steps (the run's steps per epoch / {n})")
    if ctx.get("train.epochs") is None and ctx.get("train.max_steps") is None:
        ctx.set("train.epochs", 1)
        ctx.note(None, "train.epochs: 1 is axolotl's default num_epochs (the config sets none)")
    if ctx.get("data.eval") is not None and ctx.get("eval.strategy") is None and ctx.get("eval.per_epoch") is None:
        ctx.note(None, "the config holds out eval data but sets no eval schedule: set eval.strategy (steps or epoch)")
    if (ctx.get("train.early_stopping") is not None and ctx.get("eval.strategy") is None
            and ctx.get("eval.per_epoch") is None):
        ctx.set("eval.strategy", "epoch")
        ctx.note(None, "eval.strategy: epoch, so that early_stopping_patience has evaluations to watch")


def convert(file: str) -> Any:
    return build(PEER, file, TABLE, UNKNOWN, finish)
