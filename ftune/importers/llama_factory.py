"""LLaMA-Factory training YAML (model/method/dataset/train keys, plus transformers' TrainingArguments) → ftune recipe.

Datasets are names in `dataset_info.json` under `dataset_dir`; when that file is found next to the config
(or in the working directory) each name is resolved to its file and columns, else it is imported as a hub
dataset name in LLaMA-Factory's default (alpaca) formatting. The table is documented in docs/import.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ftune.errors import FtuneError, Location
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
    as_float,
    as_int,
    choose,
    deepspeed_from_file,
    fsdp_config_table,
    hf_fsdp_options,
    hf_optimizer,
    hf_scheduler,
    report_to,
)

PEER = "llama-factory"
UNKNOWN = "no ftune key for this LLaMA-Factory option"
USED_LATER = Key(None, lambda v, c, p: NOTHING)  # read by finish() together with related keys


def stage(value: Any, ctx: Context, path: PeerPath) -> Any:
    """sft/pt train the next-token loss; dpo and kto are ftune objectives (pref_loss picks orpo, simpo or a DPO
    loss type, in finish); rm and ppo have none, and any recipe would train something else: refused, located."""
    if value in ("sft", "pt"):
        return NOTHING
    if value in ("dpo", "kto"):
        return value
    ctx.refuse(path, f"stage {value!r} has no ftune objective (ftune trains sft, pt, dpo, kto and, through "
               "pref_loss, orpo and simpo)", "a recipe with another objective would train something else: "
               "write the recipe by hand if an ftune objective fits")
    return NOTHING


def pref_loss(value: Any, ctx: Context, path: PeerPath) -> Any:
    """LLaMA-Factory's pref_loss: sigmoid is DPO's own loss; orpo and simpo are objectives of their own in ftune;
    hinge, ipo, ... are TRL DPO loss types."""
    if ctx.config.get("stage") != "dpo":
        raise Unmappable(f"pref_loss applies to stage: dpo (this config's stage is {ctx.config.get('stage', 'sft')!r})")
    if value in ("orpo", "simpo"):
        ctx.set("train.objective", value)
    elif value != "sigmoid":
        ctx.set("train.preference.loss_type", str(value))
    return NOTHING


def pref_ftx(value: Any, ctx: Context, path: PeerPath) -> Any:
    if as_float(value) == 0:
        return NOTHING
    raise ChangesBehaviour(f"pref_ftx {value}: an SFT loss added to the preference loss; ftune's objectives have "
                           "no such term, so the run optimises the preference loss alone")


# LLaMA-Factory template names -> ftune's built-in chat templates that render the same text (tested: rows rendered
# both ways, tests/unit/test_import_templates.py). llama3 and gemma trim each turn's surrounding whitespace, which
# LLaMA-Factory keeps: rows whose turns start or end with spaces or newlines differ by them.
TEMPLATE_NAMES: dict[str, str] = {"llama3": "llama3", "chatml": "chatml", "qwen3": "qwen3", "qwen3_nothink": "chatml",
                                  "gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "phi": "phi3",
                                  "alpaca": "alpaca"}
# Near misses: a built-in of the same family whose text differs
NOT_EQUAL: dict[str, str] = {
    "qwen": "LLaMA-Factory's qwen adds the system turn 'You are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.', ftune's qwen 'You are a helpful assistant.'",
    "mistral": "LLaMA-Factory's mistral writes '[INST] question[/INST]', ftune's mistral '[INST] question [/INST]'",
}


def template(value: Any, ctx: Context, path: PeerPath) -> Any:
    """LLaMA-Factory renders every row (alpaca rows too) through `template`: ftune's data.chat_template by name,
    with the instruction sources rendered as chat (as_chat, set in finish)."""
    if ctx.config.get("stage") == "pt":
        return NOTHING  # plain text: no template is applied
    if value not in TEMPLATE_NAMES:
        why = f" ({NOT_EQUAL[value]})" if value in NOT_EQUAL else ""
        raise ChangesBehaviour(f"template {value!r} has no ftune built-in that renders the same text{why} (imported: "
                               f"{', '.join(sorted(TEMPLATE_NAMES))}): the rows would be rendered differently; set "
                               "data.chat_template (a name or Jinja text) by hand")
    ctx.set("data.as_chat", True)  # read (and removed) by finish
    return TEMPLATE_NAMES[value]


def finetuning_type(value: Any, ctx: Context, path: PeerPath) -> Any:
    if value in ("lora", "full"):
        return value
    if value == "freeze":
        raise Unmappable("freeze picks the last N layers by count, which depends on the model: write "
                         "`peft: {method: freeze, trainable: [<regexes>]}` by hand")
    raise Unmappable(f"finetuning_type {value!r} has no ftune method (lora, full, freeze)")


def lora_target(value: Any, ctx: Context, path: PeerPath) -> Any:
    names = [n.strip() for n in str(value).split(",") if n.strip()] if isinstance(value, str) else list(value)
    return "all-linear" if names == ["all"] else names


def quantization_bit(value: Any, ctx: Context, path: PeerPath) -> Any:
    bits = as_int(value)
    if bits not in (4, 8):
        raise Unmappable(f"{bits}-bit: ftune quantizes with bitsandbytes in 4 or 8 bits")
    method = ctx.config.get("quantization_method", "bnb")
    if method != "bnb":
        raise Unmappable(f"quantization_method {method!r}: ftune quantizes with bitsandbytes (bnb) only")
    return bits


def precision(kind: str):
    def translate(value: Any, ctx: Context, path: PeerPath) -> Any:
        if as_bool(value):
            ctx.set("train.mixed_precision", kind)
        return NOTHING

    return translate


def val_size(value: Any, ctx: Context, path: PeerPath) -> Any:
    size = as_float(value)
    if size == 0:
        return NOTHING
    if not 0 < size < 1:
        raise Unmappable(f"a held-out count ({value}): ftune holds out a fraction (data.eval.split)")
    return {"split": size}


def mix_strategy(value: Any, ctx: Context, path: PeerPath) -> Any:
    """concat, or interleave_under / interleave_over: data.mix interleave, stopping at the first or the last
    source to run out (datasets' first_exhausted / all_exhausted, as LLaMA-Factory passes them)."""
    stop = {"interleave_under": "first_exhausted", "interleave_over": "all_exhausted"}.get(str(value))
    if str(value) == "concat":
        return NOTHING
    if stop is None:
        raise Unmappable(f"mix_strategy {value!r}: LLaMA-Factory's are concat, interleave_under, interleave_over")
    ctx.set("data.mix", "interleave")
    ctx.set("data.mix_stopping", stop)
    return NOTHING


def interleave_weights(ctx: Context) -> None:
    """`interleave_probs: "0.7,0.3"`: each training source's data.train[i].weight (ftune draws with probability
    weight/Σweights, the same as probabilities that sum to 1)."""
    value = ctx.config.get("interleave_probs")
    train = ctx.get("data.train")
    if value in (None, "") or not isinstance(train, list):
        return
    try:
        probs = [float(p) for p in (value.split(",") if isinstance(value, str) else value)]
    except (TypeError, ValueError):
        ctx.skip(("interleave_probs",), f"not a list of numbers: {value!r}", changes=True)
        return
    if len(probs) != len(train) or any(p <= 0 for p in probs):
        ctx.skip(("interleave_probs",), f"{len(probs)} probabilities for {len(train)} imported training "
                 "source(s), or one not above 0: set data.train[i].weight by hand", changes=True)
        return
    for source, prob in zip(train, probs):
        source["weight"] = prob


def eval_strategy(value: Any, ctx: Context, path: PeerPath) -> Any:
    return choose({"steps": "steps", "epoch": "epoch", "no": "no"}, "eval strategy")(value, ctx, path)


def special_tokens(value: Any, ctx: Context, path: PeerPath) -> Any:
    """`new_special_tokens: "<a>,<b>"` (or a list) -> model.add_tokens, kept in order, without repeats."""
    tokens = [str(t).strip() for t in (value if isinstance(value, list) else str(value).split(","))]
    return list(dict.fromkeys([*(ctx.get("model.add_tokens") or []), *(t for t in tokens if t)]))


TABLE: dict[str, Key | Skip] = {
    # model
    "model_name_or_path": Key("model.path"),
    "model_revision": Key("model.revision"),
    "adapter_name_or_path": USED_LATER,  # model.path at the adapter (finish: continue_adapter)
    "trust_remote_code": Key("model.trust_remote_code", lambda v, c, p: as_bool(v)),
    "hf_hub_token": Skip("a token is never copied into a recipe: write `model.hub_token: ${env:HF_TOKEN}`"),
    "flash_attn": Key("model.attn_implementation", lambda v, c, p: _attention(v)),
    "new_special_tokens": Key("model.add_tokens", special_tokens),
    "add_special_tokens": Key("model.add_tokens", special_tokens),
    "resize_vocab": Skip("ftune resizes the embeddings when model.add_tokens outgrows them; nothing to set"),
    "template": Key("data.chat_template", template),
    "enable_liger_kernel": Key("train.kernels", lambda v, c, p: "liger" if as_bool(v) else NOTHING),
    "use_unsloth": Skip("ftune has no Unsloth switch"),
    "rope_scaling": Skip("ftune has no RoPE-scaling key (edit the model's config.json)"),
    "disable_gradient_checkpointing": Key("train.gradient_checkpointing", lambda v, c, p: not as_bool(v)),
    "gradient_checkpointing": Key("train.gradient_checkpointing", lambda v, c, p: as_bool(v)),
    # method
    "stage": Key("train.objective", stage),
    "pref_beta": Key("train.preference.beta", lambda v, c, p: as_float(v)),
    "pref_loss": Key(None, pref_loss),
    "pref_ftx": Key(None, pref_ftx),
    "simpo_gamma": Key("train.preference.gamma", lambda v, c, p: as_float(v)),
    "dpo_label_smoothing": Key("train.preference.label_smoothing", lambda v, c, p: as_float(v) or NOTHING),
    "kto_chosen_weight": Key("train.preference.desirable_weight", lambda v, c, p: as_float(v)),
    "kto_rejected_weight": Key("train.preference.undesirable_weight", lambda v, c, p: as_float(v)),
    "ref_model": Skip("ftune's reference is the base model (LoRA: adapter disabled; full: a frozen copy)",
                      changes=True),
    "do_train": Key(None, lambda v, c, p: NOTHING if as_bool(v) else _no_training()),
    "finetuning_type": Key("peft.method", finetuning_type),
    "lora_rank": Key("peft.r", lambda v, c, p: as_int(v)),
    "lora_alpha": Key("peft.alpha", lambda v, c, p: as_float(v)),
    "lora_dropout": Key("peft.dropout", lambda v, c, p: as_float(v)),
    "lora_target": Key("peft.target_modules", lora_target),
    "additional_target": Key("peft.modules_to_save", lambda v, c, p: lora_target(v, c, p)),
    "use_rslora": Key("peft.use_rslora", lambda v, c, p: as_bool(v)),
    "use_dora": Key("peft.use_dora", lambda v, c, p: as_bool(v)),
    "pissa_init": Key("peft.init", lambda v, c, p: "pissa" if as_bool(v) else NOTHING),
    "loraplus_lr_ratio": Skip("ftune has no LoRA+ learning-rate ratio", changes=True),
    "quantization_bit": Key("quantization.bits", quantization_bit),
    "quantization_method": USED_LATER,
    "quantization_type": Key("quantization.type", choose({"nf4": "nf4", "fp4": "fp4"}, "4-bit type")),
    "double_quantization": Key("quantization.double_quant", lambda v, c, p: as_bool(v)),
    # dataset
    "dataset": USED_LATER,
    "eval_dataset": USED_LATER,
    "dataset_dir": USED_LATER,
    "max_samples": USED_LATER,
    "cutoff_len": Key("data.max_seq_length", lambda v, c, p: as_int(v)),
    "packing": Key("data.packing", lambda v, c, p: _packing(v, c, p)),
    "neat_packing": Key("data.packing", lambda v, c, p: as_bool(v) or NOTHING),
    "train_on_prompt": Key("data.train_on", lambda v, c, p: "all" if as_bool(v) else "completion"),
    "mask_history": Skip("ftune trains every assistant turn with train_on: completion; it can't train only the last",
                          changes=True),
    "val_size": Key("data.eval", val_size),
    "preprocessing_num_workers": Key("data.num_proc", lambda v, c, p: as_int(v)),
    "overwrite_cache": Skip("ftune's data cache is keyed by the data, tokenizer and settings: it never goes stale"),
    "tokenized_path": Skip("ftune caches tokenized data itself (data.cache_dir)"),
    "streaming": Key("data.streaming", lambda v, c, p: as_bool(v)),
    "mix_strategy": Key(None, mix_strategy),
    "interleave_probs": USED_LATER,  # each source's data.train[i].weight (finish: interleave_weights)
    # training arguments
    "output_dir": Key("output.dir"),
    "overwrite_output_dir": Key("output.overwrite", lambda v, c, p: as_bool(v)),
    "per_device_train_batch_size": Key("train.per_device_batch_size", lambda v, c, p: as_int(v)),
    "per_device_eval_batch_size": Key("eval.batch_size", lambda v, c, p: as_int(v)),
    "gradient_accumulation_steps": Key("train.gradient_accumulation_steps", lambda v, c, p: as_int(v)),
    "learning_rate": Key("train.learning_rate", lambda v, c, p: as_float(v)),
    "num_train_epochs": Key("train.epochs", lambda v, c, p: as_float(v)),
    "max_steps": Key("train.max_steps", lambda v, c, p: as_int(v) if as_int(v) > 0 else NOTHING),
    "lr_scheduler_type": Key("train.lr_scheduler", hf_scheduler),
    "lr_scheduler_kwargs": Key("train.lr_scheduler_args", lambda v, c, p: dict(v) if isinstance(v, dict) and v else NOTHING),
    "warmup_ratio": Key("train.warmup_ratio", lambda v, c, p: as_float(v) or NOTHING),
    "warmup_steps": Key("train.warmup_steps", lambda v, c, p: as_int(v) or NOTHING),
    "weight_decay": Key("train.weight_decay", lambda v, c, p: as_float(v)),
    "max_grad_norm": Key("train.max_grad_norm", lambda v, c, p: as_float(v)),
    "optim": Key("train.optimizer", hf_optimizer),
    "bf16": Key(None, precision("bf16")),
    "fp16": Key(None, precision("fp16")),
    "pure_bf16": Key("model.dtype", lambda v, c, p: "bfloat16" if as_bool(v) else NOTHING),
    "tf32": Skip("ftune has no TF32 switch (torch's default matmul precision is used)", changes=True),
    "adam_beta1": Key(None, adam_setting("beta1")),
    "adam_beta2": Key(None, adam_setting("beta2")),
    "adam_epsilon": Key(None, adam_setting("eps")),
    "dataloader_num_workers": Key("train.dataloader.workers", lambda v, c, p: as_int(v)),
    "torch_compile": Key("train.compile", lambda v, c, p: as_bool(v)),
    "seed": Key("train.seed", lambda v, c, p: as_int(v)),
    "logging_steps": Key("train.logging_steps", lambda v, c, p: as_int(v)),
    "neftune_noise_alpha": Key("train.neftune_alpha", lambda v, c, p: as_float(v)),
    "save_strategy": Key("checkpoint.strategy", choose({"steps": "steps", "epoch": "epoch", "no": "no"}, "save strategy")),
    "save_steps": Key("checkpoint.steps", lambda v, c, p: as_int(v)),
    "save_total_limit": Key("checkpoint.keep", lambda v, c, p: as_int(v)),
    "save_only_model": Skip("ftune checkpoints always hold the optimizer state, so they resume"),
    "load_best_model_at_end": Key("checkpoint.load_best", lambda v, c, p: as_bool(v)),
    "resume_from_checkpoint": Key("checkpoint.resume", lambda v, c, p: str(v)),
    "eval_strategy": Key("eval.strategy", eval_strategy),
    "evaluation_strategy": Key("eval.strategy", eval_strategy),
    "eval_steps": Key("eval.steps", lambda v, c, p: as_int(v)),
    "do_eval": Skip("ftune evaluates by eval.strategy"),
    "report_to": Key("output.report_to", report_to),
    "run_name": Key("name", lambda v, c, p: run_name(v)),
    "plot_loss": Key("output.loss_curve", lambda v, c, p: as_bool(v)),
    "deepspeed": Key(None, deepspeed_from_file),
    "fsdp": Key(None, hf_fsdp_options),
    **fsdp_config_table(("fsdp_config.",)),
    "ddp_timeout": Key("distributed.timeout", lambda v, c, p: as_int(v)),
    "include_num_input_tokens_seen": Skip("ftune logs no token counts"),
}


def _no_training() -> Any:
    raise Unmappable("ftune imports training configs (do_train: true); evaluation is `ftune eval`")


def _attention(value: Any) -> Any:
    mapping = {"auto": NOTHING, "disabled": "eager", "sdpa": "sdpa", "fa2": "flash_attention_2"}
    if value not in mapping:
        raise Unmappable(f"flash_attn {value!r} has no ftune equivalent (auto, disabled, sdpa, fa2)")
    return mapping[value]


def _packing(value: Any, ctx: Context, path: PeerPath) -> Any:
    if not as_bool(value):
        return False
    if not ctx.config.get("neat_packing"):
        ctx.note(path, "ftune packs without cross-sample attention (LLaMA-Factory's neat_packing); "
                 "plain packing lets packed samples attend to each other")
    return True


# ------------------------------------------------------------------------------------------ datasets
_ALPACA = {"prompt": "instruction", "query": "input", "response": "output"}
_SHAREGPT = {"messages": "conversations"}
_SHAREGPT_TAGS = {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
                  "system_tag": "system"}


def _dataset_info(ctx: Context) -> tuple[dict | None, Path]:
    folder = Path(str(ctx.config.get("dataset_dir", "data")))
    for base in (ctx.file.parent, Path.cwd()):
        info = (base / folder / "dataset_info.json") if not folder.is_absolute() else folder / "dataset_info.json"
        if info.is_file():
            try:
                data = json.loads(info.read_text(encoding="utf-8"))
            except json.JSONDecodeError as err:  # never silently ignored: every dataset name would be misread
                raise FtuneError(f"{info} is not valid JSON: {err.msg}", hint="fix the file LLaMA-Factory reads "
                                 "dataset names from", location=Location(str(info), err.lineno, err.colno)) from None
            except (OSError, UnicodeDecodeError) as err:
                raise FtuneError(f"can't read {info}: {err}", location=Location(str(info))) from None
            if not isinstance(data, dict):
                raise FtuneError(f"{info} is not a JSON object of dataset names",
                                 hint="LLaMA-Factory's dataset_info.json maps each name to {file_name, ...}",
                                 location=Location(str(info), 1, 1))
            return data, info
    return None, folder / "dataset_info.json"


def _source(name: str, entry: dict | None, ctx: Context, path: PeerPath, pretraining: bool) -> dict | None:
    folder = str(ctx.config.get("dataset_dir", "data"))
    stage = ctx.config.get("stage")
    if entry is not None and not isinstance(entry, dict):
        ctx.skip(path, f"{name!r}: its dataset_info.json entry is {type(entry).__name__}, not an object")
        return None
    if entry is None:
        fmt = {"pt": "text", "dpo": "preference", "kto": "unpaired-preference"}.get(stage, "instruction")
        ctx.note(path, f"{name!r} is not described in {folder}/dataset_info.json (not found or not listed): "
                 f"imported as a hub dataset name in ftune's {fmt} format (check its columns)")
        return {"path": name, "type": "hub", "format": fmt}
    if "file_name" in entry:
        out: dict[str, Any] = {"path": f"{folder.rstrip('/')}/{entry['file_name']}"}
    elif "hf_hub_url" in entry:
        out = {"path": str(entry["hf_hub_url"]), "type": "hub"}
    else:
        ctx.skip(path, f"{name!r}: only file_name and hf_hub_url sources are imported (not ms_hub_url, script_url, ...)")
        return None
    if "split" in entry:
        out["split"] = str(entry["split"])
    columns = entry.get("columns") or {}
    tags = entry.get("tags") or {}
    formatting = entry.get("formatting", "alpaca")
    for key, value in (("columns", columns), ("tags", tags)):
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            ctx.skip(path, f"{name!r}: its {key!r} in dataset_info.json must map names to column names (strings)")
            return None
    fields: dict[str, str] = {}
    if entry.get("ranking") or stage in ("dpo", "kto"):
        return _preference_source(name, entry, out, ctx, path)
    if pretraining:
        out["format"] = "text"
        if columns.get("prompt", "text") != "text":
            fields["text"] = columns["prompt"]
    elif formatting == "alpaca":
        out["format"] = "instruction"
        for peer_key, ftune_key in _ALPACA.items():
            column = columns.get(peer_key, _ALPACA[peer_key])
            if column != ftune_key:
                fields[ftune_key] = column
        for extra in ("system", "history", "images", "videos", "tools"):
            if extra in columns:
                ctx.skip(path, f"{name!r}: the {extra!r} column has no place in ftune's instruction format")
    elif formatting == "sharegpt":
        out["format"] = "chat"
        messages = columns.get("messages", "conversations")
        fields["messages"] = messages
        role = tags.get("role_tag", "from")
        content = tags.get("content_tag", "value")
        if role != "role":
            fields["role"] = role
        if content != "content":
            fields["content"] = content
        roles = {tags.get("user_tag", "human"): "user", tags.get("assistant_tag", "gpt"): "assistant",
                 tags.get("system_tag", "system"): "system"}
        roles = {k: v for k, v in roles.items() if k != v and (k, v) not in (("human", "user"), ("gpt", "assistant"))}
        if roles:
            out["roles"] = roles
        for extra in ("system", "tools", "images", "videos"):
            if extra in columns:
                ctx.skip(path, f"{name!r}: the {extra!r} column has no place in ftune's chat format")
    else:
        ctx.skip(path, f"{name!r}: formatting {formatting!r} has no ftune data format (alpaca, sharegpt)")
        return None
    if fields:
        out["fields"] = fields
    return out


def _preference_source(name: str, entry: dict, out: dict, ctx: Context, path: PeerPath) -> dict | None:
    """A ranking dataset (prompt, chosen, rejected) for stage dpo: ftune's `preference` format. Others can't be read
    as LLaMA-Factory reads them, and training on them as anything else changes the run: listed loudly."""
    columns = entry.get("columns") or {}
    if ctx.config.get("stage") != "dpo" or not entry.get("ranking"):
        ctx.skip(path, f"{name!r}: {'ranking' if entry.get('ranking') else 'non-ranking'} data for stage "
                 f"{ctx.config.get('stage', 'sft')!r}; ftune imports ranking (prompt/chosen/rejected) data for stage "
                 "dpo only (KTO's kto_tag rows: write data.train with format unpaired-preference by hand)",
                 changes=True)
        return None
    if entry.get("formatting", "alpaca") != "alpaca":
        ctx.skip(path, f"{name!r}: ranking data in {entry.get('formatting')!r} formatting; ftune imports alpaca-style "
                 "ranking data (prompt, chosen, rejected columns)", changes=True)
        return None
    out["format"] = "preference"
    fields = {k: str(columns.get(k, default)) for k, default in
              (("prompt", "instruction"), ("chosen", "chosen"), ("rejected", "rejected"))}
    if any(v != k for k, v in fields.items()):
        out["fields"] = {k: v for k, v in fields.items() if v != k}
    if "query" in columns:
        ctx.skip(path, f"{name!r}: the {columns['query']!r} (query) column is not read: ftune's preference prompt is "
                 "one column, so rows with an input lose it", changes=True)
    return out


def _sources(key: str, ctx: Context, info: dict | None, pretraining: bool) -> list[dict]:
    value = ctx.config.get(key)
    if value is not None and not isinstance(value, (str, list)):
        ctx.skip((key,), f"{key} must be a dataset name or a list of them, got {type(value).__name__}")
        return []
    names = [n.strip() for n in value.split(",")] if isinstance(value, str) else list(value or [])
    out = []
    for name in names:
        if not isinstance(name, str):
            ctx.skip((key,), f"{key}: {name!r} is not a dataset name")
            continue
        converted = _source(name, (info or {}).get(name), ctx, (key,), pretraining)
        if converted is not None:
            out.append(converted)
    limit = ctx.config.get("max_samples")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        if key == "dataset":  # said once, for both dataset and eval_dataset
            ctx.skip(("max_samples",), f"max_samples must be a whole number, got {limit!r}")
        limit = None
    if limit and out:
        for source in out:  # LLaMA-Factory truncates each dataset to max_samples
            source["limit"] = int(limit)
    return out


def finish(ctx: Context) -> None:
    c = ctx.config
    ctx.out.setdefault("name", run_name(ctx.file.stem))  # output_dir ends in sft/ or lora/ by convention
    pretraining = c.get("stage") == "pt"
    info, where = _dataset_info(ctx) if c.get("dataset") or c.get("eval_dataset") else (None, None)
    if info is not None:
        ctx.note(("dataset",), f"dataset names resolved through {where}")
    train = _sources("dataset", ctx, info, pretraining)
    if train:
        ctx.set("data.train", train)
    else:
        ctx.skip(("dataset",), "no dataset could be imported; ftune needs at least one under data.train")
    evals = _sources("eval_dataset", ctx, info, pretraining)
    if evals:
        ctx.set("data.eval", evals)
    if pretraining:
        ctx.set("data.train_on", "all")
    interleave_weights(ctx)
    continue_adapter(ctx, "adapter_name_or_path")
    as_chat = ctx.out.get("data", {}).pop("as_chat", False)
    if as_chat:  # LLaMA-Factory renders alpaca rows through its template too
        for split in ("train", "eval"):
            for src in ctx.get(f"data.{split}") if isinstance(ctx.get(f"data.{split}"), list) else []:
                if src.get("format") == "instruction":
                    src["as_chat"] = True
    if ctx.get("train.objective") in ("orpo", "simpo"):
        ctx.out["train"].get("preference", {}).pop("reference", None)
    # LLaMA-Factory defaults that differ from ftune's
    if "finetuning_type" not in c:
        ctx.set("peft.method", "lora")
    if ctx.get("peft.method") == "lora":
        rank = ctx.get("peft.r", 8)
        ctx.out["peft"].setdefault("alpha", float(rank * 2))  # lora_alpha defaults to twice the rank
        ctx.out["peft"].setdefault("dropout", 0.0)
        ctx.out["peft"].setdefault("target_modules", "all-linear")  # lora_target: all
    else:
        ctx.out["peft"] = {"method": ctx.get("peft.method")}
    if ctx.get("train.gradient_checkpointing") is None:
        ctx.set("train.gradient_checkpointing", True)  # on unless disable_gradient_checkpointing
    if ctx.get("train.epochs") is None and ctx.get("train.max_steps") is None:
        ctx.set("train.epochs", 3.0)
        ctx.note(None, "train.epochs: 3 is the transformers default num_train_epochs (the config sets none)")
    q = ctx.get("quantization")
    if q:
        if q.get("bits") == 4:
            q.setdefault("type", "nf4")
            q.setdefault("double_quant", True)  # LLaMA-Factory's double_quantization default
            q["compute_dtype"] = {"fp16": "float16"}.get(ctx.get("train.mixed_precision"), "bfloat16")
        else:
            for key in ("type", "double_quant"):
                q.pop(key, None)
    if ctx.get("eval.strategy") == "steps" and ctx.get("eval.steps") is None:
        ctx.set("eval.steps", int(ctx.get("train.logging_steps", 500)))  # transformers: eval_steps = logging_steps
    if ctx.get("data.eval") is None and ctx.get("eval.strategy") not in (None, "no"):
        ctx.note(None, "an eval schedule without eval data: set data.eval (val_size or eval_dataset)")


def convert(file: str) -> Any:
    return build(PEER, file, TABLE, UNKNOWN, finish)
