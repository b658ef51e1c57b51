"""torchtune config (sections built from `_component_` names: model, tokenizer, checkpointer, dataset,
optimizer, lr_scheduler, ...) → ftune recipe.

Components are recognised by name (never imported): the model builder's prefix says the method
(`lora_*`, `qlora_*`, else full), the dataset builder says the format. The weights come from the
checkpointer's HF folder. The table is documented in docs/import.md.
"""

from __future__ import annotations

from typing import Any

from ftune.importers._core import (
    NOTHING,
    Context,
    Key,
    PeerPath,
    Skip,
    Unmappable,
    build,
    run_name,
)
from ftune.importers._values import (
    as_bool,
    as_float,
    as_int,
    clipping,
    report_to_wandb,
)

PEER = "torchtune"
UNKNOWN = "no ftune key for this torchtune option"


def component(value: Any) -> str:
    """The builder's own name: `torchtune.models.llama3.lora_llama3_8b` → `lora_llama3_8b`."""
    return str(value).rpartition(".")[2]


# ------------------------------------------------------------------------------------------ model
def model_component(value: Any, ctx: Context, path: PeerPath) -> Any:
    name = component(value)
    if name.startswith("qlora_"):
        ctx.set("peft.method", "lora")
        _four_bit(ctx)
    elif name.startswith("lora_"):
        ctx.set("peft.method", "lora")
    else:
        ctx.set("peft.method", "full")
    ctx.note(path, f"{name}: the weights are read from checkpointer.checkpoint_dir (model.path)")
    return NOTHING


def _four_bit(ctx: Context) -> None:
    # torchao's NF4 also quantizes the per-block scales (double quantization)
    ctx.set("quantization.bits", 4)
    ctx.set("quantization.type", "nf4")
    ctx.set("quantization.double_quant", True)


_MODULES = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}


def attn_modules(value: Any, ctx: Context, path: PeerPath) -> Any:
    names = []
    for name in value if isinstance(value, list) else [value]:
        if name not in _MODULES:
            ctx.skip(path, f"attention module {name!r} has no Hugging Face name ftune knows")
            continue
        names.append(_MODULES[name])
    ctx.set("peft.target_modules", [*names, *(ctx.get("peft.target_modules") or [])])
    return NOTHING


def apply_to(names: list[str]):
    def translate(value: Any, ctx: Context, path: PeerPath) -> Any:
        if as_bool(value):
            current = ctx.get("peft.target_modules") or []
            ctx.set("peft.target_modules", [*current, *names])
            if names != ["lm_head"]:
                ctx.note(path, f"torchtune's MLP (w1, w2, w3) is {', '.join(names)} in Hugging Face Llama-style models")
        return NOTHING

    return translate


# ------------------------------------------------------------------------------------------ data
_DATASETS = {  # builder -> (format, default source, fields, roles)
    "alpaca_dataset": ("instruction", "tatsu-lab/alpaca", {}),
    "alpaca_cleaned_dataset": ("instruction", "yahma/alpaca-cleaned", {}),
    "slimorca_dataset": ("chat", "Open-Orca/SlimOrca-Dedup", {"messages": "conversations", "role": "from",
                                                              "content": "value"}),
    "text_completion_dataset": ("text", None, {}),
    "chat_dataset": ("chat", None, {}),
    "instruct_dataset": ("instruction", None, {}),
}
_LOADERS = ("json", "csv", "parquet", "text")


def dataset(entry: dict, ctx: Context, path: PeerPath) -> dict | None:
    from ftune.hub import looks_local

    name = component(entry.get("_component_", ""))
    if name not in _DATASETS:
        ctx.skip((*path, "_component_"), f"dataset builder {name!r} has no ftune data format "
                 f"(imported: {', '.join(_DATASETS)})")
        return None
    fmt, default_source, fields = _DATASETS[name]
    src = entry.get("source", default_source)
    out: dict[str, Any] = {"format": fmt}
    fields = dict(fields)
    handled = {"_component_", "source"}
    if src in _LOADERS:
        files = entry.get("data_files")
        handled.add("data_files")
        if not isinstance(files, str) and not (isinstance(files, list) and len(files) == 1):
            ctx.skip((*path, "data_files"), "an ftune source is one file: list one source per file under data.train")
            return None
        out["path"] = files if isinstance(files, str) else str(files[0])
        out["type"] = src
    elif src is None:
        ctx.skip(path, f"{name} without `source`: nothing to read")
        return None
    else:
        out["path"] = str(src)
        if not looks_local(str(src)):
            out["type"] = "hub"
            ctx.note((*path, "source"), f"{src!r} is read as a hub dataset (type: hub); a hub must be reachable, "
                     "or download it and give the local path")
    if name == "chat_dataset":
        handled |= {"conversation_column", "conversation_style"}
        style = entry.get("conversation_style", "sharegpt")
        fields["messages"] = str(entry.get("conversation_column", "conversations"))
        if style == "sharegpt":
            fields.update(role="from", content="value")
        elif style != "openai":
            ctx.skip((*path, "conversation_style"), f"conversation style {style!r}: ftune reads sharegpt and openai")
            return None
    if name == "text_completion_dataset":
        handled.add("column")
        fields["text"] = str(entry.get("column", "text"))
    if name == "instruct_dataset":
        handled.add("column_map")
        cmap = entry.get("column_map") or {}
        fields["instruction"] = str(cmap.get("input", "input"))
        fields["output"] = str(cmap.get("output", "output"))
        out["template"] = "{instruction}\n"
        ctx.note(path, "instruct_dataset feeds the input column as is: imported with template '{instruction}\\n'; "
                 "torchtune also wraps it in the tokenizer's prompt format")
    if "train_on_input" not in entry and path[0] == "dataset" and fmt != "text":  # text trains every token
        _train_on(ctx, path, TRAIN_ON_INPUT_DEFAULT.get(name, "completion"))  # the builder's default
    for key, value in entry.items():
        here = (*path, key)
        if key in handled or value is None:
            continue
        if key == "split":
            out["split"] = str(value)
        elif key == "packed":
            if as_bool(value):
                ctx.set("data.packing", True)
        elif key == "train_on_input":
            _train_on(ctx, here, "all" if as_bool(value) else "completion")
        elif key == "new_system_prompt":
            ctx.skip(here, "ftune adds no system prompt to the data")
        else:
            ctx.skip(here, "no ftune equivalent for this dataset option")
    defaults = {"messages": "messages", "role": "role", "content": "content", "text": "text",
                "instruction": "instruction", "input": "input", "output": "output"}
    fields = {k: v for k, v in fields.items() if defaults[k] != v}
    if fields:
        out["fields"] = fields
    return {"path": out.pop("path"), **out}


# torchtune's train_on_input default per builder: the alpaca builders train on the prompt too
TRAIN_ON_INPUT_DEFAULT = {"alpaca_dataset": "all", "alpaca_cleaned_dataset": "all"}


def _train_on(ctx: Context, path: PeerPath, value: str) -> None:
    """data.train_on is one setting in ftune; torchtune sets it per dataset: sources that disagree change the run."""
    current = ctx.get("data.train_on")
    if current is not None and current != value:
        ctx.skip(path, f"train_on_input gives {value!r} here and {current!r} for an earlier dataset; ftune's "
                 f"data.train_on is one setting for all sources (kept {current!r})", changes=True)
        return
    ctx.set("data.train_on", value)


def datasets(value: Any, ctx: Context, path: PeerPath) -> Any:
    entries = value if isinstance(value, list) else [value]
    out = []
    for i, entry in enumerate(entries):
        here = (*path, i) if isinstance(value, list) else path
        if not isinstance(entry, dict):
            ctx.skip(here, "expected a dataset section with _component_")
            continue
        converted = dataset(entry, ctx, here)
        if converted is not None:
            out.append(converted)
    if not out:
        raise Unmappable("no dataset could be imported; ftune needs at least one under data.train")
    return out


# ------------------------------------------------------------------------------------ optimisation
_OPTIMIZERS = {
    "torch.optim.AdamW": "adamw_torch",
    "torch.optim.SGD": "sgd",
    "torch.optim.Adagrad": "adagrad",
    "torch.optim.RMSprop": "rmsprop",
    "bitsandbytes.optim.PagedAdamW8bit": "paged_adamw_8bit",
    "bitsandbytes.optim.PagedAdamW": "paged_adamw_32bit",
    "bitsandbytes.optim.PagedAdamW32bit": "paged_adamw_32bit",
    "bitsandbytes.optim.AdamW8bit": "adamw_bnb_8bit",
    "torchao.optim.AdamW8bit": "adamw_torch_8bit",
    "torchao.optim.AdamW4bit": "adamw_torch_4bit",
}


def optimizer(value: Any, ctx: Context, path: PeerPath) -> Any:
    name = str(value)
    if name not in _OPTIMIZERS:
        raise Unmappable(f"optimizer {name!r} has no transformers `optim` equivalent "
                         f"(imported: {', '.join(_OPTIMIZERS)})")
    fused = ctx.config.get("optimizer", {}).get("fused")
    ctx.set("train.optimizer", "adamw_torch_fused" if name == "torch.optim.AdamW" and fused else _OPTIMIZERS[name])
    return NOTHING


_SCHEDULERS = {"get_cosine_schedule_with_warmup": "cosine", "get_linear_schedule_with_warmup": "linear",
               "get_constant_schedule_with_warmup": "constant_with_warmup"}


def scheduler(value: Any, ctx: Context, path: PeerPath) -> Any:
    name = component(value)
    if name not in _SCHEDULERS:
        raise Unmappable(f"scheduler {name!r} has no ftune equivalent (imported: {', '.join(_SCHEDULERS)})")
    return _SCHEDULERS[name]


def dtype(value: Any, ctx: Context, path: PeerPath) -> Any:
    if value == "bf16":
        ctx.set("model.dtype", "bfloat16")
        ctx.set("train.mixed_precision", "bf16")
    elif value == "fp32":
        ctx.set("model.dtype", "float32")
    else:
        raise Unmappable(f"dtype {value!r}: torchtune trains in bf16 or fp32")
    return NOTHING


def checkpointer(value: Any, ctx: Context, path: PeerPath) -> Any:
    name = component(value)
    if name != "FullModelHFCheckpointer":
        raise Unmappable(f"{name} reads a non-Hugging Face checkpoint; ftune loads Hugging Face model folders "
                         "(model.path)")
    return NOTHING


def metric_logger(value: Any, ctx: Context, path: PeerPath) -> Any:
    name = component(value)
    if name == "WandBLogger":
        report_to_wandb(ctx)
    elif name == "TensorBoardLogger":
        ctx.set("output.report_to", ["tensorboard"])
    elif name in ("DiskLogger", "StdoutLogger"):
        ctx.set("output.report_to", ["none"])
        ctx.note(path, f"{name}: ftune always writes metrics.jsonl in the run dir and logs to the console")
    else:
        raise Unmappable(f"metric logger {name!r} has no ftune tracker")
    return NOTHING


def wandb_env(var: str):
    def translate(value: Any, ctx: Context, path: PeerPath) -> Any:
        raise Unmappable(f"ftune has no key for it; export {var}={value}")

    return translate


def fsdp(target: str, convert=as_bool):
    def translate(value: Any, ctx: Context, path: PeerPath) -> Any:
        ctx.set("distributed.strategy", "fsdp")
        ctx.set(target, convert(value))
        return NOTHING

    return translate


def _sharding(value: Any) -> str:
    name = str(value).lower()
    if name not in ("full_shard", "shard_grad_op", "hybrid_shard", "no_shard"):
        raise Unmappable(f"sharding strategy {value!r} has no ftune equivalent")
    return name


def max_steps_per_epoch(value: Any, ctx: Context, path: PeerPath) -> Any:
    steps = as_int(value)
    epochs = ctx.config.get("epochs")
    raise Unmappable(f"ftune has no per-epoch cap; train.max_steps caps the whole run "
                     f"(e.g. {steps * int(epochs)} for {epochs} epochs)" if epochs else "ftune has no per-epoch cap; "
                     "train.max_steps caps the whole run")



# torchtune's cross-entropy variants that only save memory (the logits in chunks of tokens, or the output projection
# fused into the loss): the same loss, which ftune computes in slices with `train.tiled_loss`
MEMORY_SAVING_LOSSES = ("CEWithChunkedOutputLoss", "LinearCrossEntropyLoss")


def loss(value: Any, ctx: Context, path: PeerPath) -> Any:
    """`loss._component_`: ftune trains the model's own cross-entropy; a chunked or fused one is the tiled loss."""
    name = str(value).rsplit(".", 1)[-1]
    if name in MEMORY_SAVING_LOSSES:
        ctx.set("train.tiled_loss", True)
        return NOTHING
    raise Unmappable("ftune uses the model's own cross-entropy loss")


TABLE: dict[str, Key | Skip] = {
    "model._component_": Key(None, model_component),
    "model.lora_attn_modules": Key(None, attn_modules),
    "model.apply_lora_to_mlp": Key(None, apply_to(["gate_proj", "up_proj", "down_proj"])),
    "model.apply_lora_to_output": Key(None, apply_to(["lm_head"])),
    "model.lora_rank": Key("peft.r", lambda v, c, p: as_int(v)),
    "model.lora_alpha": Key("peft.alpha", lambda v, c, p: as_float(v)),
    "model.lora_dropout": Key("peft.dropout", lambda v, c, p: as_float(v)),
    "model.use_dora": Key("peft.use_dora", lambda v, c, p: as_bool(v)),
    "model.quantize_base": Key(None, lambda v, c, p: _four_bit(c) if as_bool(v) else NOTHING),
    "tokenizer._component_": Skip("ftune loads the model folder's own tokenizer (AutoTokenizer)"),
    "tokenizer.path": Skip("ftune loads the tokenizer from model.path (a tokenizer folder would go in model.tokenizer)"),
    "tokenizer.max_seq_len": Key("data.max_seq_length", lambda v, c, p: as_int(v)),
    "tokenizer.prompt_template": Skip("ftune renders chat data with the tokenizer's chat template or "
                                      "data.chat_template (Jinja text)", changes=True),
    "checkpointer._component_": Key(None, checkpointer),
    "checkpointer.checkpoint_dir": Key("model.path", lambda v, c, p: str(v)),
    "checkpointer.checkpoint_files": Skip("ftune loads every weight file of model.path"),
    "checkpointer.recipe_checkpoint": Skip("ftune resumes from its own checkpoints (checkpoint.resume)"),
    "checkpointer.output_dir": Skip("ftune writes final/ and checkpoints/ into the run dir (output.dir)"),
    "checkpointer.model_type": Skip("ftune reads the architecture from model.path's config.json"),
    "checkpointer.adapter_checkpoint": Skip("ftune starts a new adapter"),
    "resume_from_checkpoint": Key("checkpoint.resume", lambda v, c, p: "auto" if as_bool(v) else False),
    "save_adapter_weights_only": Skip("ftune saves the adapter in final/ and full checkpoints that resume"),
    "dataset": Key("data.train", datasets),
    "dataset_val": Key("data.eval", datasets),
    "run_val_every_n_steps": Key(None, lambda v, c, p: _eval_every(as_int(v), c)),
    "seed": Key("train.seed", lambda v, c, p: as_int(v)),
    "shuffle": Key("data.shuffle", lambda v, c, p: as_bool(v)),
    "batch_size": Key("train.per_device_batch_size", lambda v, c, p: as_int(v)),
    "batch_size_val": Key("eval.batch_size", lambda v, c, p: as_int(v)),
    "epochs": Key("train.epochs", lambda v, c, p: as_float(v)),
    "max_steps_per_epoch": Key(None, max_steps_per_epoch),
    "gradient_accumulation_steps": Key("train.gradient_accumulation_steps", lambda v, c, p: as_int(v)),
    "clip_grad_norm": Key("train.max_grad_norm", clipping),
    "optimizer._component_": Key(None, optimizer),
    "optimizer.lr": Key("train.learning_rate", lambda v, c, p: as_float(v)),
    "optimizer.weight_decay": Key("train.weight_decay", lambda v, c, p: as_float(v)),
    "optimizer.fused": Key(None, lambda v, c, p: NOTHING),  # read with optimizer._component_
    "optimizer.betas": Key("train.optimizer_args.betas", lambda v, c, p: [as_float(b) for b in v]),
    "optimizer.eps": Key("train.optimizer_args.eps", lambda v, c, p: as_float(v)),
    "optimizer_in_bwd": Skip("ftune steps the optimizer after backward (the Trainer's loop)"),
    "lr_scheduler._component_": Key("train.lr_scheduler", scheduler),
    "lr_scheduler.num_warmup_steps": Key("train.warmup_steps", lambda v, c, p: as_int(v)),
    "lr_scheduler.num_cycles": Skip("ftune's cosine is the half-cycle schedule; it has no num_cycles key",
                                     changes=True),
    "loss._component_": Key(None, loss),
    "loss.num_output_chunks": Key("train.tiled_loss_shards", lambda v, c, p: as_int(v)),
    "compile": Key("train.compile", lambda v, c, p: as_bool(v)),
    "device": Skip("ftune picks the device (GPUs when visible, else CPU)"),
    "dtype": Key(None, dtype),
    "enable_activation_checkpointing": Key("train.gradient_checkpointing", lambda v, c, p: as_bool(v)),
    "enable_activation_offloading": Key("train.activation_offloading", lambda v, c, p: as_bool(v)),
    "fsdp_cpu_offload": Key(None, fsdp("distributed.fsdp.cpu_offload")),
    "fsdp_reshard_after_forward": Key(None, fsdp("distributed.fsdp.reshard_after_forward")),
    "fsdp_sharding_strategy": Key(None, fsdp("distributed.fsdp.sharding_strategy", _sharding)),
    "custom_sharded_layers": Skip("ftune wraps transformer layers (distributed.fsdp.transformer_layer_cls); "
                                  "it can't shard other modules separately"),
    "metric_logger._component_": Key(None, metric_logger),
    "metric_logger.project": Key(None, wandb_env("WANDB_PROJECT")),
    "metric_logger.entity": Key(None, wandb_env("WANDB_ENTITY")),
    "metric_logger.name": Key(None, wandb_env("WANDB_NAME")),
    "metric_logger.group": Key(None, wandb_env("WANDB_RUN_GROUP")),
    "metric_logger.log_dir": Skip("ftune writes logs into the run dir (output.dir)"),
    "output_dir": Key("output.dir", lambda v, c, p: str(v)),
    "log_every_n_steps": Key("train.logging_steps", lambda v, c, p: as_int(v)),
    "log_peak_memory_stats": Skip("ftune has no peak-memory logging switch (`ftune plan` estimates it)"),
    "profiler.*": Skip("ftune has no profiler section"),
}


def _eval_every(steps: int, ctx: Context) -> Any:
    ctx.set("eval.strategy", "steps")
    ctx.set("eval.steps", steps)
    return NOTHING


def finish(ctx: Context) -> None:
    c = ctx.config
    ctx.out.setdefault("name", run_name(ctx.file.stem))  # output_dir is often a /tmp path
    if ctx.get("peft.method") is None:
        ctx.set("peft.method", "full")
    if ctx.get("peft.method") == "lora":
        ctx.out["peft"].setdefault("dropout", 0.0)  # torchtune's lora_dropout default
        if ctx.get("peft.target_modules"):
            ctx.set("peft.target_modules", list(dict.fromkeys(ctx.get("peft.target_modules"))))
    if ctx.get("quantization.bits") is not None:
        ctx.set("quantization.compute_dtype", "bfloat16" if ctx.get("model.dtype") != "float32" else "float32")
    if "lr_scheduler" not in c:
        ctx.set("train.lr_scheduler", "constant")
        ctx.note(None, "train.lr_scheduler: constant (the config has no lr_scheduler, so torchtune keeps the "
                 "learning rate fixed)")
    if "optimizer" in c and "_component_" not in (c["optimizer"] or {}):
        ctx.skip(("optimizer",), "an optimizer section without _component_")
    if ctx.get("distributed.strategy") is None:
        ctx.note(None, "torchtune picks single-device or distributed by the recipe you run (tune run ...); "
                 "this config has no fsdp_* key, so it imports as one process: for *_distributed recipes set "
                 "distributed.strategy: fsdp and distributed.num_processes: auto")
    if ctx.get("train.epochs") is None and ctx.get("train.max_steps") is None:
        ctx.set("train.epochs", 1)
        ctx.note(None, "train.epochs: 1 (the config sets no epochs)")
    if ctx.get("checkpoint.strategy") is None:
        ctx.set("checkpoint.strategy", "epoch")  # torchtune saves at the end of each epoch
    if c.get("clip_grad_norm") is None:
        ctx.set("train.max_grad_norm", 0.0)  # torchtune clips only when clip_grad_norm is set; ftune's default is 1.0
    opt = c.get("optimizer") or {}
    if isinstance(opt, dict) and str(opt.get("_component_", "")).endswith("AdamW") and "weight_decay" not in opt:
        ctx.set("train.weight_decay", 0.01)  # torch.optim.AdamW's default; ftune's (transformers') is 0
    if ctx.get("data.train_on") == "completion" and "data" in ctx.out:
        ctx.out["data"].pop("train_on")  # ftune's default
    if ctx.get("data.packing") and ctx.get("data.max_seq_length") is None:
        ctx.note(None, "packed data needs data.max_seq_length (torchtune's tokenizer.max_seq_len)")


def convert(file: str) -> Any:
    return build(PEER, file, TABLE, UNKNOWN, finish)
