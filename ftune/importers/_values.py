"""Value translators the peers share: numbers as peers write them, transformers' optimizer, scheduler and
tracker names, transformers/accelerate FSDP options, and DeepSpeed JSON files."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ftune.importers._core import NOTHING, Context, Key, PeerPath, Skip, Unmappable

# ------------------------------------------------------------------------------------------ values
def as_float(value: Any) -> float:
    """Numbers as peers write them; YAML reads `1e-5` (no dot) as a string."""
    if isinstance(value, bool):
        raise Unmappable(f"expected a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise Unmappable(f"expected a number, got {value!r}") from None


def as_int(value: Any) -> int:
    number = as_float(value)
    if number != int(number):
        raise Unmappable(f"expected a whole number, got {value!r}")
    return int(number)


def as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no"):
        return value.lower() in ("true", "yes")
    raise Unmappable(f"expected true or false, got {value!r}")


def choose(mapping: dict[str, Any], what: str) -> Callable[[Any, Context, PeerPath], Any]:
    """A translate function for an enumerated value; other values are unmapped, naming the ones known."""

    def translate(value: Any, ctx: Context, path: PeerPath) -> Any:
        key = str(value).lower() if isinstance(value, str) else value
        if key not in mapping:
            raise Unmappable(f"{what} {value!r} has no ftune equivalent (known: {', '.join(map(str, mapping))})")
        return mapping[key]

    return translate


# transformers' `optim` names (TrainingArguments); ftune passes train.optimizer through unchanged.
HF_OPTIMIZERS = frozenset(
    """adamw_torch adamw_torch_fused adamw_torch_xla adamw_torch_npu_fused adamw_apex_fused adafactor
    adamw_anyprecision adamw_torch_4bit adamw_torch_8bit ademamix sgd adagrad adamw_bnb_8bit adamw_8bit
    ademamix_8bit lion_8bit lion_32bit paged_adamw_32bit paged_adamw_8bit paged_ademamix_32bit
    paged_ademamix_8bit paged_lion_32bit paged_lion_8bit rmsprop rmsprop_bnb rmsprop_bnb_8bit
    rmsprop_bnb_32bit galore_adamw galore_adamw_8bit galore_adafactor galore_adamw_layerwise
    galore_adamw_8bit_layerwise galore_adafactor_layerwise lomo adalomo grokadamw schedule_free_radam
    schedule_free_adamw schedule_free_sgd apollo_adamw apollo_adamw_layerwise stable_adamw""".split()
)


def hf_optimizer(value: Any, ctx: Context, path: PeerPath) -> str:
    name = str(value)
    if name not in HF_OPTIMIZERS:
        raise Unmappable(f"optimizer {name!r} is not a transformers `optim` name, which is what train.optimizer takes")
    return name


def hf_scheduler(value: Any, ctx: Context, path: PeerPath) -> str:
    from ftune.recipe.schema import LR_SCHEDULERS

    if value not in LR_SCHEDULERS:
        raise Unmappable(f"scheduler {value!r} has no ftune equivalent (train.lr_scheduler: {', '.join(LR_SCHEDULERS)})")
    return value


REPORTERS = ("tensorboard", "wandb", "mlflow", "comet_ml", "trackio")


def report_to(value: Any, ctx: Context, path: PeerPath) -> list[str]:
    """transformers' report_to: a name, a comma list, a list, `none` or `all`."""
    names = value if isinstance(value, list) else str(value).replace(",", " ").split()
    if names in (["all"],):
        return list(REPORTERS[:2])
    if names in ([], ["none"]):
        return ["none"]
    bad = [n for n in names if n not in REPORTERS]
    if bad:
        raise Unmappable(f"tracker {', '.join(map(repr, bad))} is not one ftune reports to ({', '.join(REPORTERS)})")
    return names


def report_to_wandb(ctx: Context) -> None:
    current = ctx.get("output.report_to")
    if current is None or current == ["none"]:
        ctx.set("output.report_to", ["wandb"])
    elif "wandb" not in current:
        ctx.set("output.report_to", [*current, "wandb"])


# ----------------------------------------------------------------------------------- distributed
HF_SHARDING = {"full_shard": "full_shard", "shard_grad_op": "shard_grad_op", "hybrid_shard": "hybrid_shard",
               "no_shard": "no_shard"}


def hf_fsdp_options(value: Any, ctx: Context, path: PeerPath) -> Any:
    """transformers' `fsdp` option list ("full_shard auto_wrap offload" or a list) → distributed.fsdp."""
    words = value if isinstance(value, list) else str(value).split()
    if not words or words == [False]:
        return NOTHING
    ctx.set("distributed.strategy", "fsdp")
    for word in words:
        word = str(word)
        if word in HF_SHARDING:
            ctx.set("distributed.fsdp.sharding_strategy", HF_SHARDING[word])
        elif word == "offload":
            ctx.set("distributed.fsdp.cpu_offload", True)
        elif word != "auto_wrap":
            ctx.skip(path, f"FSDP option {word!r} has no ftune equivalent")
    return NOTHING


def fsdp_version(value: Any, ctx: Context, path: PeerPath) -> Any:
    version = as_int(value)
    if version not in (1, 2):
        raise Unmappable(f"FSDP version {value!r}: ftune has versions 1 and 2")
    ctx.set("distributed.fsdp.version", version)
    return NOTHING


_WRAP = {"transformer_based_wrap": "transformer", "size_based_wrap": "size", "no_wrap": "none"}
_STATE_DICT = {"full_state_dict": "full", "sharded_state_dict": "sharded"}


def fsdp_config_table(prefixes: tuple[str, ...]) -> dict[str, Key | Skip]:
    """accelerate-style fsdp_config keys (with or without their `fsdp_` prefix) → distributed.fsdp.*."""

    def wrap_classes(value: Any, ctx: Context, path: PeerPath) -> list[str]:
        return [c.strip() for c in value.split(",")] if isinstance(value, str) else list(value)

    def sharding(value: Any, ctx: Context, path: PeerPath) -> str:
        name = str(value).lower()
        if name.isascii() and name.isdigit():  # accelerate writes 1..4
            name = {"1": "full_shard", "2": "shard_grad_op", "3": "no_shard", "4": "hybrid_shard"}.get(name, name)
        if name not in HF_SHARDING:
            raise Unmappable(f"sharding strategy {value!r} has no ftune equivalent")
        return name

    fields: dict[str, Key | Skip] = {
        "version": Key(None, fsdp_version),
        "offload_params": Key("distributed.fsdp.cpu_offload", lambda v, c, p: as_bool(v)),
        "cpu_offload": Key("distributed.fsdp.cpu_offload", lambda v, c, p: as_bool(v)),
        "state_dict_type": Key("distributed.fsdp.state_dict_type", choose(_STATE_DICT, "state dict type")),
        "auto_wrap_policy": Key("distributed.fsdp.auto_wrap_policy", choose(_WRAP, "wrap policy")),
        "transformer_layer_cls_to_wrap": Key("distributed.fsdp.transformer_layer_cls", wrap_classes),
        "min_num_params": Key("distributed.fsdp.min_num_params", lambda v, c, p: as_int(v)),
        "sharding_strategy": Key("distributed.fsdp.sharding_strategy", sharding),
        "cpu_ram_efficient_loading": Key("distributed.fsdp.cpu_ram_efficient_loading", lambda v, c, p: as_bool(v)),
        "sync_module_states": Key("distributed.fsdp.sync_module_states", lambda v, c, p: as_bool(v)),
        "reshard_after_forward": Key("distributed.fsdp.reshard_after_forward", lambda v, c, p: as_bool(v)),
        "forward_prefetch": Key("distributed.fsdp.forward_prefetch", lambda v, c, p: as_bool(v)),
        "activation_checkpointing": Key("distributed.fsdp.activation_checkpointing", lambda v, c, p: as_bool(v)),
        "use_orig_params": Skip("ftune always wraps with use_orig_params (needed for adapters); nothing to set"),
        "limit_all_gathers": Skip("ftune has no key for FSDP limit_all_gathers (accelerate's default is used)"),
        "backward_prefetch": Key(
            "distributed.fsdp.backward_prefetch",
            choose({"backward_pre": "backward_pre", "backward_post": "backward_post", "no_prefetch": "none"},
                   "backward prefetch"),
        ),
    }
    table: dict[str, Key | Skip] = {}
    for prefix in prefixes:
        for name, entry in fields.items():
            table[f"{prefix}{name}"] = entry
            table[f"{prefix}fsdp_{name}"] = entry
    return table


def deepspeed_from_file(value: Any, ctx: Context, path: PeerPath) -> Any:
    """A DeepSpeed JSON path → distributed.deepspeed stage/offload, read from the file when it is found
    (next to the peer config, then the working directory), else from its name (zero3, ds_z2_offload, ...)."""
    import json

    name = str(value)
    ctx.set("distributed.strategy", "deepspeed")
    found = next((p for p in (ctx.file.parent / name, Path(name)) if p.is_file()), None)
    stage = offload_opt = offload_params = None
    if found is not None:
        try:
            zero = json.loads(found.read_text(encoding="utf-8")).get("zero_optimization", {})
        except (OSError, ValueError, AttributeError):
            zero = {}
        stage = zero.get("stage")
        offload_opt = (zero.get("offload_optimizer") or {}).get("device") in ("cpu", "nvme")
        offload_params = (zero.get("offload_param") or {}).get("device") in ("cpu", "nvme")
        source = f"read from {found}"
    else:
        match = re.search(r"(?:zero|_z)(\d)", Path(name).name.lower())
        stage = int(match.group(1)) if match else None
        offload_opt = "offload" in name.lower()
        offload_params = offload_opt and stage == 3
        source = "taken from the file name (the file was not found)"
    if stage not in (1, 2, 3):
        raise Unmappable(f"can't tell the ZeRO stage of {name!r}: set distributed.deepspeed.stage")
    ctx.set("distributed.deepspeed.stage", stage)
    if offload_opt:
        ctx.set("distributed.deepspeed.offload_optimizer", True)
    if offload_params and stage == 3:
        ctx.set("distributed.deepspeed.offload_params", True)
    ctx.note(path, f"ZeRO stage {stage}{' with CPU offload' if offload_opt else ''} {source}; ftune writes its own "
                   f"ZeRO config (to use this file as is, set distributed.deepspeed.config to its path)")
    return NOTHING


# ------------------------------------------------------------------------------------------ shared by the peers
ATTENTION = ("eager", "sdpa", "flash_attention_2", "flex_attention")


def attn_implementation(value: Any, ctx: Context, path: PeerPath) -> Any:
    """transformers' attn_implementation name -> model.attn_implementation (the same names)."""
    if value not in ATTENTION:
        raise Unmappable(f"attention {value!r} has no ftune equivalent (model.attn_implementation: "
                         f"{', '.join(ATTENTION)})")
    return value


def adam_setting(which: str) -> Callable[[Any, Context, PeerPath], Any]:
    """transformers' adam_beta1 / adam_beta2 / adam_epsilon -> train.optimizer_args betas / eps. A beta alone keeps
    the other at transformers' default (0.9, 0.999), so both are written."""

    def translate(value: Any, ctx: Context, path: PeerPath) -> Any:
        if which == "eps":
            ctx.set("train.optimizer_args.eps", as_float(value))
            return NOTHING
        betas = list(ctx.get("train.optimizer_args.betas") or [0.9, 0.999])
        betas[0 if which == "beta1" else 1] = as_float(value)
        ctx.set("train.optimizer_args.betas", betas)
        return NOTHING

    return translate


def clipping(value: Any, ctx: Context, path: PeerPath) -> Any:
    """A gradient-clipping norm; `null`/none/0 = no clipping, which ftune writes as max_grad_norm: 0."""
    if value is None or str(value).lower() in ("none", "null", "0", "0.0", "false"):
        return 0.0
    return as_float(value)


PREFERENCE_OBJECTIVES = ("dpo", "orpo", "kto", "simpo")


# ------------------------------------------------------------------------------------------ adapters
def continue_adapter(ctx: Context, key: str) -> None:
    """`adapter_name_or_path` (LLaMA-Factory) / `lora_model_dir` (axolotl): ftune trains a saved adapter on when
    `model.path` is its folder (the base comes from the folder's adapter_config.json), so the adapter becomes
    model.path. Several adapters can't be continued as one."""
    value = ctx.config.get(key)
    if value in (None, ""):
        return
    folders = [f.strip() for f in value.split(",") if f.strip()] if isinstance(value, str) else value
    if not isinstance(folders, list) or len(folders) != 1:
        ctx.skip((key,), "several adapters: ftune continues one (merge the others into the base first: "
                         "`ftune merge`, then model.path at the merged folder)", changes=True)
        return
    base = ctx.get("model.path")
    ctx.set("model.path", str(folders[0]))
    ctx.note((key,), "model.path is the adapter folder: ftune trains that adapter on, over the base its "
                     f"adapter_config.json names{f' (the config gave {base})' if base else ''}")
