"""What a recipe will do and cost, from the model's config alone: `ftune plan`'s engine.

The model is built on the meta device (shapes, no data), the recipe's PEFT method is applied with
the same `ftune.methods.<m>.inject` the worker uses, and the quantization layout is applied as
bitsandbytes would store it. Parameter counts are then peft's own; memory comes from
`ftune.estimate.memory`, over the devices as `ftune.estimate.layout` lays it out. No weights are read and nothing is
allocated per parameter.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, field, replace

from ftune.errors import FtuneError, Problem, RecipeError
from ftune.estimate.fp8 import Fp8Cost, fp8_cost
from ftune.estimate.fp8 import converted as fp8_converted
from ftune.estimate.generation import GenerationMemory, generation_memory
from ftune.models.meta import DTYPES, MetaModel, meta_model
from ftune.estimate.teacher import TeacherFacts, teacher_facts, with_teacher
from ftune.estimate.moe import MoeFacts, mlp_values, moe_facts
from ftune.estimate.memory import fmt_bytes, parse_bytes, per_device  # noqa: F401  (parse_bytes: for the CLI)
from ftune.estimate.facts import MemoryItem, ParamFact
from ftune.estimate.optimizer import optimizer_spec
from ftune.estimate.layout import (FsdpLayout, detect_device_memory, fsdp_layout, host_memory, layer_classes,
                                   make_layout)
from ftune.estimate.long_rows import (could_tile_loss, finisher, hidden_size, host_cap, host_note, longer_rows,
                                     tiled)
from ftune.estimate.parallel import longest_row, split_layout
from ftune.estimate.step_probe import in_flight
from ftune.plan.tiling import loss_shards, shards
from ftune.tiled_loss import shard_count, text_config
from ftune.estimate.suggest import suggest
from ftune.estimate.vision_cost import VisionFacts, base_parts, with_images
from ftune.models.config import linear_layer_names
from ftune.recipe.schema import FsdpSection, Recipe


@dataclass(frozen=True)
class Estimate:
    model: str
    config_source: str
    """Where the config came from: `local <dir>`, `hf-cache <file>`, `model.config <file>` or `catalog <file>`."""
    dtype: str
    params_total: int
    params_trainable: int
    matched_modules: list[str]
    """Modules the method changed (LoRA targets, adapted layers) or, for `freeze`, trained parameters."""
    world_size: int
    num_processes: int
    device: str
    fsdp: FsdpLayout | None
    memory: list[MemoryItem]
    peak_phase: str
    total_bytes: int
    offloaded_bytes: int
    device_memory: int | None
    fits: bool | None
    largest: list[str]
    suggestions: list[str]
    notes: list[str] = field(default_factory=list)
    moe: MoeFacts | None = None
    """Mixture-of-experts models: total and active parameters, FLOPs per token, the adapter by model part."""
    vision: VisionFacts | None = None
    """Vision-language models: parameters per part, total and trainable; what an image costs."""
    longest_seq: int | None = None  # longest row (tokens) whose peak fits the device memory (estimate.parallel)
    teacher: TeacherFacts | None = None
    """distill: the teacher's weights, logits and forward FLOPs per step beside the student's."""
    generation: GenerationMemory | None = None
    """grpo/rloo: the KV cache one process's generation batch holds (estimate.generation)."""
    fp8: Fp8Cost | None = None
    """`train.precision: fp8`: the layers converted, a step's cost and memory beside bf16 (estimate.fp8)."""

    @property
    def trainable_percent(self) -> float:
        return 100.0 * self.params_trainable / self.params_total if self.params_total else 0.0

    def as_json(self) -> dict:
        out = asdict(self)
        out["trainable_percent"] = round(self.trainable_percent, 4)
        for item in out["memory"]:
            item["at_peak"] = item["phase"] in ("always", self.peak_phase)
        return out


# ------------------------------------------------------------------------------------------ config
def _apply_method(model, recipe: Recipe, trained_tokens: list[int] | None = None):
    from ftune.methods import method_module

    cfg = recipe.peft
    if cfg.adapts_linear_layers and cfg.init != "default":
        cfg = cfg.model_copy(update={"init": "default"})  # same shapes; PiSSA's SVD can't run on the meta device
    linear = linear_layer_names(model)
    try:
        if trained_tokens and cfg.adapts_linear_layers:  # as the worker's peft stage
            return method_module(cfg.method).inject(model, cfg, recipe.model.task, trained_tokens=trained_tokens)
        return method_module(cfg.method).inject(model, cfg, recipe.model.task)
    except RecipeError:
        raise
    except FtuneError as e:  # e.g. freeze's "matches no parameter": at the key that says what to train
        if e.location is not None:
            raise
        key = cfg.inject_errors_at
        raise RecipeError([Problem.at(key, e.message.removeprefix(f"{key} "), e.hint)]) from None
    except ValueError as e:
        if "target" not in str(e).lower() and "not found" not in str(e).lower():
            raise
        wanted = cfg.target_modules if isinstance(cfg.target_modules, str) else ", ".join(cfg.target_modules)
        raise RecipeError([Problem.at("peft.target_modules", f"({wanted}) matches no module of the model",
                                      f"the model's linear layers are: {', '.join(linear)}")]) from None


def _quantize_layout(model, recipe: Recipe) -> set[int]:
    """Ids of the weights bitsandbytes will quantize (chosen exactly as the quantize stage does), after
    the k-bit preparation's upcast (`upcasts`): every other weight becomes fp32, as on the real model."""
    if recipe.kbit is None:
        return set()
    from ftune.plan.quantization import fused_expert_problems, quantized_linears, upcasts

    if problems := fused_expert_problems(recipe, model):
        raise RecipeError(problems)

    modules = dict(model.named_modules())
    ids = {id(modules[name].weight) for name in quantized_linears(recipe, model)}
    if upcasts(recipe):
        model.float()  # stand-ins for the 4-bit layers too: bitsandbytes returns its input's dtype
    return ids


def _param_facts(model, quantized: set[int], recipe: Recipe) -> list[ParamFact]:
    q = recipe.kbit
    kind = None if q is None else ("int8" if q.bits == 8 else q.type)
    seen: set[int] = set()
    facts = []
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:  # tied weights are stored once
            continue
        seen.add(id(p))
        facts.append(
            ParamFact(
                name=name,
                shape=tuple(p.shape),
                dtype=str(p.dtype).removeprefix("torch."),
                itemsize=p.element_size(),
                trainable=p.requires_grad,
                quant=kind if id(p) in quantized else None,
            )
        )
    return facts


# --------------------------------------------------------------------------------------- estimate
def estimate(
    recipe: Recipe,
    *,
    world_size: int,
    num_processes: int,
    gpu_memory: int | None,
    device: str | None = None,
    seq_length: int | None = None,
    meta: MetaModel | None = None,
    host_ram: int | None = None,
) -> Estimate:
    """Parameters, layout and per-device memory of `recipe`, from its model config alone.

    `device`: `cuda` or `cpu`; default `cuda` when `gpu_memory` is given or a GPU is visible.
    `seq_length`: tokens per row for activations; default data.max_seq_length, else the model's maximum.
    `meta`: the recipe's model on the meta device as the compiler built it (`ftune.plan.compile.Compiled.meta`),
    else built here from the config the one resolver finds; either way the estimate changes it (tokens added, the
    method injected), so a caller hands it on once.
    `host_ram`: the RAM of one machine (`plan --host-memory`), which offloaded bytes must fit; default this
    machine's when planning for its own GPU, unknown for another's.
    """
    if (dist := recipe.distributed).strategy == "fsdp" and dist.fsdp is None:  # no section: its defaults run
        recipe = recipe.model_copy(update={"distributed": dist.model_copy(update={"fsdp": FsdpSection()})})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _estimate(recipe, meta or meta_model(recipe), world_size, num_processes, gpu_memory, device,
                         seq_length, host_ram)


def _estimate(recipe: Recipe, meta: MetaModel, world_size: int, num_processes: int,
              gpu_memory: int | None, device: str | None, seq_length: int | None, host_ram: int | None) -> Estimate:
    from ftune.estimate.probe import formula_profile, probe_activations

    from ftune.estimate.qat import cost_lines as qat_cost_lines
    from ftune.estimate.tokens import plan_tokens

    model, config, dtype, source = meta.model, meta.config, meta.dtype, meta.source
    notes: list[str] = []
    tokens = plan_tokens(recipe, model.get_input_embeddings().num_embeddings)
    if tokens is not None:
        if tokens.embeddings > model.get_input_embeddings().num_embeddings:
            model.resize_token_embeddings(tokens.embeddings, mean_resizing=False)
        notes.append(f"tokens: {tokens.new} added (embedding rows {tokens.embeddings:,}), {len(tokens.trained)} "
                     "trained row(s) per embedding" + (f"; {tokens.note}" if tokens.note else ""))
    from ftune.models.moe import count, moe_layout

    experts_layout = moe_layout(model)
    moe_counts = count(model, experts_layout) if experts_layout else None
    embedding = model.get_input_embeddings().weight.numel()
    vision_base = base_parts(recipe, model, config)  # a VLM's parts, before the method adds to them
    quantized = _quantize_layout(model, recipe)
    if recipe.peft.adapts_linear_layers:  # what ftune decided about the targets (e.g. dropout 0 for expert tensors)
        from ftune.methods.lora import resolve_targets

        notes += resolve_targets(model, recipe.peft).notes
    fp8_chosen = fp8_converted(model) if recipe.train.precision == "fp8" else None
    model = _apply_method(model, recipe, tokens.trained if tokens else None)
    model = model.to("meta")  # prefix encoders and adaption prompts may have been created on the CPU
    facts = _param_facts(model, quantized, recipe)
    if hasattr(model, "get_nb_trainable_parameters"):
        trainable, total = model.get_nb_trainable_parameters()
    else:
        total = sum(f.numel for f in facts)
        trainable = sum(f.numel for f in facts if f.trainable)

    detected_device, detected = detect_device_memory()
    device = device or ("cuda" if gpu_memory is not None else detected_device)
    device_memory = gpu_memory if gpu_memory is not None else detected
    if device == "cpu" and device_memory is None:
        device_memory = host_memory()
        notes.append("no GPU: memory is set against this machine's RAM (pass --gpu-memory to plan for a GPU)")

    wrapped = layer_classes(model, recipe)
    seq = seq_length or recipe.data.max_seq_length or getattr(config, "max_position_embeddings", None) or 2048
    rl = recipe.train.rl  # set only under an rl-family objective (rules.rl.rl_section)
    if rl is not None and not seq_length:  # a row is a prompt plus a generated completion
        seq = (recipe.data.max_prompt_length or 0) + rl.max_completion_length or seq
        notes.append(f"{recipe.train.objective}: activations for rows of {seq} tokens "
                     f"(data.max_prompt_length {recipe.data.max_prompt_length or 'unset: 0'} + max_completion_length "
                     f"{rl.max_completion_length}); generation's KV cache is freed before the training forward "
                     "(see generation)"
                     + ("; vLLM colocated takes train.rl.generation.vllm_gpu_memory_utilization of each GPU on top"
                        if rl.generation.backend == "vllm" and rl.generation.vllm_mode == "colocate" else ""))
    elif not (seq_length or recipe.data.max_seq_length):
        notes.append(f"data.max_seq_length unset: activations assume the model's maximum, {seq} tokens")
    built = getattr(model.config, "_attn_implementation", None)
    attn = "eager" if built == "eager" else recipe.model.attn_implementation or "sdpa"
    batch = recipe.train.per_device_batch_size
    try:
        keeps_input = quantized if recipe.kbit and recipe.kbit.bits == 8 else set()
        profile = probe_activations(model, batch=batch, seq=seq, attn_implementation=attn,
                                    layer_classes=wrapped, quantized=keeps_input, task=recipe.model.task)
        measured = vision_base is None  # a VLM's step needs images: its towers are added by formula below
    except Exception as e:  # data-dependent ops (MoE routing, custom code) cannot run on the meta device
        measured = False
        said: list[str] = []
        hidden = model.get_input_embeddings().embedding_dim
        mlp = mlp_values(model, experts_layout, hidden) if experts_layout is not None else None
        profile = formula_profile(config, batch=batch, seq=seq, itemsize=DTYPES[dtype], eager=attn == "eager",
                                  model=model, layer_classes=wrapped, mlp_values=mlp, notes=said)
        notes.append(f"the activation probe could not run this model on the meta device ({type(e).__name__}): "
                     "activations use the 34 x tokens x hidden bytes-per-layer formula instead"
                     + (", its MLP part sized for the routed experts (top_k x their widths)" if mlp else ""))
        notes += said

    facts_vision, profile = (None, profile) if vision_base is None else with_images(
        recipe, vision_base, model, config, profile, batch=batch, seq=seq, itemsize=DTYPES[dtype], notes=notes)

    hidden = hidden_size(config, model)
    untiled = profile
    profile, constant = tiled(recipe, profile, seq, hidden)
    dist = recipe.distributed
    units = None
    if dist.strategy == "fsdp" and dist.fsdp is not None:
        units = fsdp_layout(model, recipe, facts, world_size, num_processes, wrapped)
    layout = make_layout(recipe, world_size, device, units, facts)
    vocab = text_config(config).vocab_size

    def loss_slices(rule) -> int:  # train.tiled_loss's slices of a row of this length
        return shard_count(rule, seq, hidden, vocab)

    if (rule := loss_shards(recipe)) is not None:
        layout = replace(layout, loss_slices=loss_slices(rule))

    def measure(prof, checkpointing: bool, rule) -> int:  # backward's gradients in flight, from a meta step
        return in_flight(model, prof, checkpointing, tile_rule=rule, batch=batch, seq=seq, attn_implementation=attn,
                         task=recipe.model.task, notes=notes) if measured else 0

    profile = replace(profile, inflight_bytes=measure(profile, layout.checkpointing, shards(recipe)))
    untiled = replace(untiled, inflight_bytes=profile.inflight_bytes)
    facts_vision = facts_vision and facts_vision.checkpointed(layout.checkpointing)
    memory = per_device(facts, profile, layout)
    memory = split_layout(memory, dist.parallelism)  # what tp / cp divide (estimate.parallel)
    teacher = teacher_facts(recipe, model, seq=seq, batch=batch)  # distill: frozen weights, logits, forward FLOPs
    memory = with_teacher(memory, teacher)
    if not optimizer_spec(recipe.train.optimizer)[1] and not (layout.low_rank and layout.optimizer.startswith(
            "galore_adamw")):
        notes.append(f"optimizer {recipe.train.optimizer!r} is not in the table: states assumed AdamW-like")
    usable = device_memory
    if device_memory is not None and rl is not None and rl.generation.backend == "vllm" \
            and rl.generation.vllm_mode == "colocate":  # vLLM's share of each GPU is not the trainer's
        usable = int(device_memory * (1 - rl.generation.vllm_gpu_memory_utilization))
    fits = None if usable is None else memory.total <= usable
    # the machine's RAM: --host-memory, else this machine's when planning for its own GPU (not for another's)
    host = host_ram if host_ram is not None else host_memory() if gpu_memory is None and device == "cuda" else None
    if memory.offloaded and device == "cuda" and (line := host_note(memory.offloaded, num_processes, host)):
        notes.append(line)
    longest = None if usable is None or attn == "eager" else longest_row(
        memory, seq, usable, dist.parallelism, getattr(config, "max_position_embeddings", None), notes, constant,
        cap=lambda rows: host_cap(memory, seq, rows, host, num_processes, notes) if device == "cuda" else rows)
    if longest is not None and rl is None and device == "cuda" and (line := longer_rows(
            recipe, facts, untiled, layout, seq, hidden, usable, longest, finisher(recipe, teacher),
            measure)) is not None:
        notes.append(line)
    generation = generation_memory(recipe, config, dtype) if rl is not None else None
    if generation is not None:
        resident = sum(i.bytes for i in memory.items if i.phase == "always")
        if resident + generation.bytes > memory.total:
            notes.append(f"generation's peak ({fmt_bytes(resident)} resident + {fmt_bytes(generation.bytes)} KV "
                         f"cache = {fmt_bytes(resident + generation.bytes)}) is above the training peak")
            fits = None if usable is None else resident + generation.bytes <= usable and bool(fits)
    fp8 = fp8_cost(fp8_chosen, config, recipe, seq, memory.total) if fp8_chosen is not None else None
    at_peak = sorted((i for i in memory.items if memory.at_peak(i)), key=lambda i: -i.bytes)
    largest = [f"{i.kind} ({i.detail}): {fmt_bytes(i.bytes)}" for i in at_peak[:3]]
    suggestions = suggest(recipe, facts, profile, layout, memory, device_memory, world_size, seq,
                          loss_slices=loss_slices("auto") if could_tile_loss(recipe, model) else None)
    notes += qat_cost_lines(recipe, model, DTYPES[dtype], batch, seq)  # quantization.qat beside the baseline
    facts_moe = None
    if moe_counts is not None:
        facts_moe = moe_facts(model, recipe, moe_counts, embedding, notes)
    return Estimate(
        model=recipe.model.path, config_source=source, dtype=dtype, params_total=total,
        params_trainable=trainable, matched_modules=recipe.peft.trained_names(model), world_size=world_size,
        num_processes=num_processes, device=device, fsdp=units, memory=list(memory.items),
        peak_phase=memory.peak_phase, total_bytes=memory.total, offloaded_bytes=memory.offloaded,
        device_memory=device_memory, fits=fits, largest=largest, suggestions=suggestions, notes=notes,
        moe=facts_moe, vision=facts_vision, longest_seq=longest, teacher=teacher, generation=generation,
        fp8=fp8)
