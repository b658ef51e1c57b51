"""What-if suggestions for `ftune plan`: concrete recipe changes, each with the peak it would give (the byte
accounting of `ftune.estimate.memory` re-run on changed facts, layout or activation profile)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ftune.estimate.facts import ActivationProfile, ParamFact
from ftune.estimate.memory import DeviceMemory, Layout, fmt_bytes, layer_split, per_device
from ftune.estimate.optimizer import optimizer_spec

if TYPE_CHECKING:
    from ftune.recipe.schema import Recipe


def suggest(recipe: Recipe, facts: list[ParamFact], profile: ActivationProfile, layout: Layout,
            memory: DeviceMemory, device_memory: int | None, world_size: int, seq: int,
            loss_slices: int | None = None) -> list[str]:
    """Concrete changes, each with the peak it would give, largest saving first. `loss_slices`: the tiled loss's
    slices where the recipe could take `train.tiled_loss` (None: it can't, or has it)."""
    options: list[tuple[int, str]] = []

    def consider(text: str, new: DeviceMemory | int) -> None:
        total = new if isinstance(new, int) else new.total
        if total < memory.total * 0.97:
            options.append((total, f"{text}: peak {fmt_bytes(memory.total)} -> {fmt_bytes(total)}"))

    if not layout.checkpointing:
        consider("enable train.gradient_checkpointing", per_device(facts, profile, replace(layout,
                                                                                           checkpointing=True)))
    spec, _ = optimizer_spec(layout.optimizer)
    if not spec.eight_bit and spec.states:
        consider("use train.optimizer: adamw_8bit", per_device(facts, profile, replace(layout,
                                                                                       optimizer="adamw_8bit")))
    if recipe.kbit is None and recipe.peft.uses_peft_library:
        q = [replace(f, quant="nf4") if _is_quantizable_fact(f) else f for f in facts]
        consider("use QLoRA (quantization: {bits: 4})", per_device(q, profile, layout))
    if layout.reference_copy:
        consider("use train.preference.reference: precomputed (no reference copy in memory)",
                 per_device(facts, profile, replace(layout, reference_copy=None)))
    if recipe.peft.trains_whole_model:
        frozen = [replace(f, trainable=False) for f in facts]
        consider("use peft.method: lora (gradients and optimizer states shrink to the adapters', ~0"
                 + (", and the reference is the base: no copy" if layout.reference_copy else "") + ")",
                 per_device(frozen, profile, replace(layout, reference_copy=None)))
    if layout.device == "cuda" and not layout.fused_loss and recipe.model.task == "causal-lm":
        consider("use train.kernels: liger (fused linear cross-entropy: no logits-sized tensors)",
                 per_device(facts, profile, replace(layout, fused_loss=True)))
    if layout.device == "cpu" and loss_slices and not (layout.fused_loss or layout.loss_slices):
        consider("use train.tiled_loss (the head and loss in slices: no logits-sized tensors, on any device)",
                 per_device(facts, profile, replace(layout, loss_slices=loss_slices)))
    if not layout.offload_activations:
        consider("enable train.activation_offloading (activations in host memory)",
                 per_device(facts, profile, replace(layout, offload_activations=True)))
    if recipe.train.per_device_batch_size > 1:
        b = recipe.train.per_device_batch_size
        scaled = _scale_profile(profile, 1 / b)
        consider(f"use train.per_device_batch_size: 1 with gradient_accumulation_steps x{b}",
                 per_device(facts, scaled, layout))
    if seq >= 1024:
        consider(f"shorten data.max_seq_length to {seq // 2} (≈)", per_device(facts, _scale_profile(profile, 0.5),
                                                                            layout))
    if layout.strategy in ("none", "ddp") and layout.device == "cuda":
        ranks = max(8, world_size * 2)
        largest, root = layer_split(facts, layout.double_quant)
        sharded = replace(layout, strategy="fsdp", shard_ranks=ranks, largest_unit_bytes=largest,
                          root_unit_bytes=root)
        consider(f"shard over {ranks} processes (distributed.strategy: fsdp, num_processes: {ranks})",
                 per_device(facts, profile, sharded))
    if device_memory is not None and memory.total <= device_memory:
        return [text for _, text in sorted(options)[:2]] if memory.total > 0.9 * device_memory else []
    return [text for _, text in sorted(options)]


def _is_quantizable_fact(f: ParamFact) -> bool:
    return len(f.shape) == 2 and not f.trainable and f.name.endswith(".weight") and "embed" not in f.name \
        and "lm_head" not in f.name and "norm" not in f.name


def _scale_profile(p: ActivationProfile, k: float) -> ActivationProfile:
    return ActivationProfile(tuple(int(b * k) for b in p.layer_bytes), tuple(int(b * k) for b in p.layer_input_bytes),
                             int(p.outside_bytes * k), int(p.head_bytes * k), tuple(int(b * k) for b in p.mlp_bytes),
                             tuple(int(b * k) for b in p.mlp_kept), int(p.inflight_bytes * k), int(p.tile_bytes * k))
