"""Training rules: what `TrainingArguments(...)`, the optimizer and the scheduler would refuse after launch.

Names come from `ftune.recipe.trainer_names` (kept in sync with transformers by a drift test). Whether an
optimizer's optional package is installed is an environment check (`ftune.plan.checks.environment`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator

from ftune.errors import Problem
from ftune.recipe.objectives import family_of
from ftune.recipe.rules import Rule
from ftune.recipe.schedule import evaluates
from ftune.recipe.schema import Recipe
from ftune.recipe.trainer_names import DEVICE_OPTIMIZERS, OPTIMIZERS, SCHEDULER_ARGS, is_low_rank

ADAM_ARGS = ("betas", "eps")


def _quoted(names) -> str:
    return ", ".join(f"`{n}`" for n in sorted(names))


def optimizer_known(recipe: Recipe) -> Iterator[Problem]:
    name = recipe.train.optimizer
    if name in DEVICE_OPTIMIZERS:
        yield Problem.at("train.optimizer", f"'{name}' needs {DEVICE_OPTIMIZERS[name]}, which ftune does not run on",
                         "use `adamw_torch_fused` (or `adamw_torch`)")
    elif name not in OPTIMIZERS:
        close = difflib.get_close_matches(name, OPTIMIZERS, n=3)
        yield Problem.at("train.optimizer", f"unknown optimizer '{name}'",
                         (f"did you mean {', '.join(repr(c) for c in close)}? " if close else "")
                         + "any transformers `optim` name works, e.g. adamw_torch_fused, adamw_8bit, paged_adamw_8bit")


def optimizer_args_fit(recipe: Recipe) -> Iterator[Problem]:
    t = recipe.train
    args = t.optimizer_args or {}
    if is_low_rank(t.optimizer) and "target_modules" not in args:
        yield Problem.at("train.optimizer", f"'{t.optimizer}' projects only the modules named in "
                         "`train.optimizer_args.target_modules`, which is not set",
                         "add e.g. `optimizer_args: {target_modules: [attn, mlp], rank: 128}` under `train:`")
    if "target_modules" in args and not is_low_rank(t.optimizer):
        yield Problem.at("train.optimizer_args.target_modules",
                         f"target_modules is used by galore_*/apollo_* optimizers only; '{t.optimizer}' would ignore it",
                         "remove it, or pick a galore_* / apollo_* optimizer")
    betas = args.get("betas")
    if betas is not None and not (isinstance(betas, list) and len(betas) == 2
                                  and all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas)):
        yield Problem.at("train.optimizer_args.betas", f"betas must be two numbers in [0, 1), got {betas!r}",
                         "e.g. `betas: [0.9, 0.999]`")
    eps = args.get("eps")
    if eps is not None and (isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps <= 0):
        yield Problem.at("train.optimizer_args.eps", f"eps must be a positive number, got {eps!r}", "e.g. `eps: 1.0e-8`")
    for key, value in args.items():
        if key not in (*ADAM_ARGS, "target_modules") and isinstance(value, list):
            yield Problem.at(f"train.optimizer_args.{key}", f"{key}: a list can't be passed as an optimizer argument",
                             "give a single number, string or boolean")
        if key not in (*ADAM_ARGS, "target_modules") and isinstance(value, str) and ("," in value or "=" in value):
            yield Problem.at(f"train.optimizer_args.{key}", f"{key}: the value {value!r} contains ',' or '='",
                             "optimizer arguments are passed as `key=value,...`: use a plain value")


def layerwise_alone(recipe: Recipe) -> Iterator[Problem]:
    t = recipe.train
    if t.optimizer.endswith("_layerwise") and recipe.distributed.strategy != "none":
        yield Problem.at("train.optimizer", f"layer-wise '{t.optimizer}' runs in one process only (transformers "
                         f"refuses it with distributed.strategy '{recipe.distributed.strategy}')",
                         f"use `{t.optimizer.removesuffix('_layerwise')}`, or `distributed.strategy: none`")
    if t.optimizer.endswith("_layerwise") and t.gradient_accumulation_steps > 1:
        yield Problem.at("train.gradient_accumulation_steps", f"layer-wise '{t.optimizer}' steps every layer in "
                         "backward, so it can't accumulate gradients",
                         "set `train.gradient_accumulation_steps: 1`, or use the non-layer-wise optimizer")


def scheduler_args_fit(recipe: Recipe) -> Iterator[Problem]:
    t = recipe.train
    accepted, required = SCHEDULER_ARGS.get(t.lr_scheduler, (frozenset(), ()))
    given = set(t.lr_scheduler_args or {})
    for key in sorted(given - accepted):
        yield Problem.at(f"train.lr_scheduler_args.{key}",
                         f"lr_scheduler '{t.lr_scheduler}' takes no argument '{key}'",
                         f"it takes {_quoted(accepted)}" if accepted else "remove `train.lr_scheduler_args`")
    for group in required:
        found = given & group
        if len(found) != 1:
            what = "one of " + _quoted(group) if len(group) > 1 else _quoted(group)
            yield Problem.at("train.lr_scheduler" if not found else f"train.lr_scheduler_args.{sorted(found)[-1]}",
                             f"lr_scheduler '{t.lr_scheduler}' needs exactly {what} in `train.lr_scheduler_args`"
                             + (f", got {_quoted(found)}" if found else ""),
                             f"e.g. `lr_scheduler_args: {{{sorted(group)[0]}: "
                             f"{'1.0e-6' if 'min_lr' in group else '100'}}}` under `train:`")
    lr_end = (t.lr_scheduler_args or {}).get("lr_end")
    if t.lr_scheduler == "polynomial" and isinstance(lr_end, (int, float)) and lr_end >= t.learning_rate:
        yield Problem.at("train.lr_scheduler_args.lr_end",
                         f"lr_end ({lr_end}) must be below train.learning_rate ({t.learning_rate})",
                         "polynomial decay goes from learning_rate down to lr_end")


def plateau_needs_eval(recipe: Recipe) -> Iterator[Problem]:
    if recipe.train.lr_scheduler == "reduce_lr_on_plateau" and not evaluates(recipe):
        yield Problem.at("train.lr_scheduler", "reduce_lr_on_plateau lowers the rate when the eval metric stalls, "
                         "but eval.strategy is 'no'",
                         "set `eval.strategy` (and `data.eval`), or another lr_scheduler")


def speed_levers_fit(recipe: Recipe) -> Iterator[Problem]:
    t = recipe.train
    if t.compile_backend is not None and not t.compile:
        yield Problem.at("train.compile_backend", "compile_backend is set but train.compile is false",
                         "set `train.compile: true`, or remove compile_backend")
    if t.group_by_length and recipe.data.packing:
        yield Problem.at("train.group_by_length", "group_by_length sorts samples by length, but packed rows all have "
                         "data.max_seq_length tokens", "use one of them: `data.packing: false` or "
                         "`train.group_by_length: false`")
    if t.dataloader.prefetch_factor is not None and t.dataloader.workers == 0:
        yield Problem.at("train.dataloader.prefetch_factor", "prefetch_factor needs dataloader workers "
                         "(train.dataloader.workers is 0)", "set `train.dataloader.workers: 2` (or more), or remove "
                         "prefetch_factor")
    if t.tiled_mlp_shards is not None and not t.tiled_mlp:
        yield Problem.at("train.tiled_mlp_shards", "tiled_mlp_shards is set but train.tiled_mlp is false",
                         "set `train.tiled_mlp: true`, or remove tiled_mlp_shards")
    if t.tiled_mlp and recipe.distributed.strategy == "deepspeed":
        yield Problem.at("train.tiled_mlp", "the tiled MLP is not supported under DeepSpeed: its backward runs the "
                         "MLP once per slice, and ZeRO-3 gathers and releases the MLP's parameters around each call",
                         "use `distributed.strategy: fsdp` (or ddp, none), or `train.tiled_mlp: false`")
    if t.kernels == "liger" and recipe.model.task != "causal-lm":
        yield Problem.at("train.kernels", "Liger's fused linear cross-entropy is a causal-LM loss; "
                         f"model.task is '{recipe.model.task}'", "set `train.kernels: none`")
    yield from tiled_loss_fits(recipe)


def tiled_loss_fits(recipe: Recipe) -> Iterator[Problem]:
    """`train.tiled_loss` replaces the model's own loss, the mean next-token NLL of the sft family's Trainer: not
    a trainer's loss over the logits (preference, RL, distillation), not a classifier's, not twice (Liger)."""
    t = recipe.train
    if t.tiled_loss_shards is not None and not t.tiled_loss:
        yield Problem.at("train.tiled_loss_shards", "tiled_loss_shards is set but train.tiled_loss is false",
                         "set `train.tiled_loss: true`, or remove tiled_loss_shards")
    if not t.tiled_loss:
        return
    if recipe.model.task == "sequence-classification":
        yield Problem.at("train.tiled_loss", "the tiled loss is a language model's next-token loss; model.task is "
                         "'sequence-classification' (one label a row: no logits-sized tensors to tile)",
                         "set `train.tiled_loss: false`")
    elif not family_of(recipe).next_token_loss:
        yield Problem.at("train.tiled_loss", f"train.objective '{t.objective}' computes its loss from the model's "
                         "logits in its trainer (TRL's), which the tiled loss would not reach: it tiles the model's "
                         "own next-token loss (train.objective: sft)", "set `train.tiled_loss: false`")
    if t.kernels == "liger":
        yield Problem.at("train.tiled_loss", "train.kernels: liger already computes the loss in chunks (its fused "
                         "linear cross-entropy never holds the logits)", "use one of them: `train.kernels: none` "
                         "(the tiled loss, any device) or `train.tiled_loss: false` (Liger, CUDA)")
    if recipe.distributed.strategy == "deepspeed":
        yield Problem.at("train.tiled_loss", "the tiled loss is not supported under DeepSpeed: its backward runs the "
                         "output head once per slice, and ZeRO-3 gathers and releases the head's weight around each "
                         "call", "use `distributed.strategy: fsdp` (or ddp, none), or `train.tiled_loss: false`")


def batch_sizes_fit(recipe: Recipe) -> Iterator[Problem]:
    """`global_batch_size` fixes the optimizer's batch, and `auto` lets the plan size the micro-batch and
    checkpointing from its memory estimate (`ftune.plan.batch_size`); what the recipe alone can say is checked here,
    the division by the job's ranks when the plan knows them."""
    t = recipe.train
    auto_batch, auto_ckpt = t.per_device_batch_size == "auto", t.gradient_checkpointing == "auto"
    if auto_batch and t.global_batch_size is None:
        yield Problem.at("train.per_device_batch_size", "per_device_batch_size auto needs the rows per optimizer step "
                         "to keep: the plan splits them into micro-batches and accumulation",
                         "set `train.global_batch_size` (e.g. 32), or a number of rows per device")
    if t.global_batch_size is not None and "gradient_accumulation_steps" in t.model_fields_set:
        yield Problem.at("train.gradient_accumulation_steps", "gradient_accumulation_steps follows from "
                         "global_batch_size (global / (per_device_batch_size x data-parallel ranks)); setting both "
                         "can disagree", "remove one of them")
    for key, on in (("per_device_batch_size", auto_batch), ("gradient_checkpointing", auto_ckpt)):
        if not on:
            continue
        if family_of(recipe).generates:
            yield Problem.at(f"train.{key}", f"{key} auto is not planned for {t.objective}: its batch is the "
                             "generation batch (whole groups of train.rl.num_generations), and generation's memory "
                             "comes and goes", f"set train.{key} to a value")
        elif recipe.data.max_seq_length is None:
            yield Problem.at(f"train.{key}", f"{key} auto sizes micro-batches of data.max_seq_length-token rows, "
                             "which is not set", "set data.max_seq_length (the longest row the run trains on)")
    fsdp = recipe.distributed.fsdp
    if auto_ckpt and recipe.distributed.strategy == "fsdp" and fsdp is not None and fsdp.activation_checkpointing:
        yield Problem.at("train.gradient_checkpointing", "distributed.fsdp.activation_checkpointing already "
                         "checkpoints every layer; auto would decide for the Trainer's, which never runs beside it",
                         "remove train.gradient_checkpointing (FSDP's is on)")


def fp8_fits(recipe: Recipe) -> Iterator[Problem]:
    """torchao's float8 training: bf16 autocast around it, torch.compile to fuse its scaling casts (eager float8 is
    slower than bf16), and plain linear layers to convert (bitsandbytes' are not)."""
    t = recipe.train
    if t.precision != "fp8":
        return
    if t.mixed_precision != "bf16":
        yield Problem.at("train.precision", f"fp8 training runs inside bf16 mixed precision; train.mixed_precision "
                         f"is {t.mixed_precision}", "set `train.mixed_precision: bf16`")
    if not t.compile:
        yield Problem.at("train.precision", "fp8 training without torch.compile runs its scaling casts as separate "
                         "kernels, slower than bf16", "set `train.compile: true`")
    if recipe.kbit is not None:
        yield Problem.at("train.precision", "fp8 training converts nn.Linear layers; a quantized base's layers are "
                         "bitsandbytes', which it can't convert", "remove `quantization` (or train.precision)")
    if recipe.qat is not None:
        yield Problem.at("train.precision", "fp8 training and quantization.qat both replace the nn.Linear layers "
                         "(float8 vs fake-quantized); one run can't do both", "remove `quantization.qat` (or "
                         "train.precision)")


RULES: list[Rule] = [optimizer_known, optimizer_args_fit, layerwise_alone, scheduler_args_fit, plateau_needs_eval,
                     speed_levers_fit, batch_sizes_fit, fp8_fits]
