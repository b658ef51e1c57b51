"""What a distillation teacher costs (`train.objective: distill`), beside the student: its weights (frozen, in
its dtype: no gradients, no optimizer state), the logits it holds for the student's loss, and its forward FLOPs per
optimizer step, from its config alone on the meta device (`ftune plan`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ftune.estimate.memory import DeviceMemory
from ftune.estimate.facts import MemoryItem
from ftune.models.meta import DTYPES


@dataclass(frozen=True)
class TeacherFacts:
    path: str
    dtype: str
    params: int
    weight_bytes: int
    """Its weights in `dtype`, whole on every device (frozen: no gradients, no optimizer state)."""
    logits_bytes: int
    """Its float32 logits for one micro-batch, alive while the student's loss is computed."""
    tokens_per_step: int
    """Tokens one optimizer step feeds both models (per device: micro-batch x accumulation x row length)."""
    forward_flops_per_step: int
    """The teacher's forward: 2 x (its matmul weights: all but the input-embedding lookup, the head counted even
    when tied) per token, per optimizer step and device."""
    student_flops_per_step: int
    """The student's training step by the same count (6 x: forward and backward), for comparison."""


def matmul_params(model) -> int:
    """Weights a token multiplies through: every parameter but the input embedding's lookup, plus the head's
    matrix when it is tied to the embedding (a lookup on the way in, a matmul on the way out)."""
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    seen = {id(p): p for p in model.parameters()}
    total = sum(p.numel() for p in seen.values()) - embed.numel()
    if head is not None and head.weight is embed:
        total += embed.numel()
    return total


def teacher_facts(recipe, student, *, seq: int, batch: int) -> TeacherFacts | None:
    """The teacher of `recipe` (None when the objective has none) built on the meta device from its config."""
    from ftune.plan.distill import teacher_load

    spec = teacher_load(recipe)
    if spec is None:
        return None
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ftune import hub

    folder = hub.folder(spec.path)
    if folder is None or not (Path(folder) / "config.json").is_file():
        return None  # the files tier names the missing teacher
    config = AutoConfig.from_pretrained(str(folder), trust_remote_code=spec.kwargs.get("trust_remote_code", False))
    dtype = spec.kwargs["dtype"]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype),
                                                 trust_remote_code=spec.kwargs.get("trust_remote_code", False))
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    vocab = model.get_output_embeddings().weight.shape[0]
    steps = recipe.train.gradient_accumulation_steps
    tokens = batch * seq * steps
    return TeacherFacts(path=spec.path, dtype=dtype, params=params, weight_bytes=params * DTYPES[dtype],
                        logits_bytes=batch * seq * vocab * 4, tokens_per_step=tokens,
                        forward_flops_per_step=2 * matmul_params(model) * tokens,
                        student_flops_per_step=6 * matmul_params(student) * tokens)


def with_teacher(memory: DeviceMemory, t: TeacherFacts | None) -> DeviceMemory:
    """The student's memory with the teacher's weights (always) and its logits (during the loss and backward)."""
    if t is None:
        return memory
    items = (*memory.items, MemoryItem("weights", f"teacher {t.dtype} (frozen)", t.weight_bytes),
             MemoryItem("temporary", "teacher logits (float32, for the loss)", t.logits_bytes, "backward"))
    phase = {ph: sum(i.bytes for i in items if i.phase == ph) for ph in ("always", "backward", "update")}
    peak = "backward" if phase["backward"] >= phase["update"] else "update"
    return replace(memory, items=items, peak_phase=peak, total=phase["always"] + phase[peak])
