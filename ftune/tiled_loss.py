"""Tiled loss (`train.tiled_loss`), ALST's sequence tiling of the loss (Bekman et al. 2025): a causal LM's output
head and cross-entropy run over the row's tokens in slices, each slice's logits computed again in its backward
(`torch.utils.checkpoint`), so the logits, tokens x vocabulary in float32 for the loss (2 GiB for 4,096 tokens of
Llama-3's 128,256 words; the largest tensors of a long row's step), and their gradients never exist for more than
one slice. Liger's fused linear cross-entropy does the same on CUDA for the families it patches; this runs the
model's own head on any device, for the families listed in `VERIFIED`. With labels the forward returns the loss and
no logits (training and evaluation); without, the model's own forward runs.

The loss is transformers' (`ForCausalLMLoss`): the labels shifted by one (or the collator's `shift_labels`), -100
ignored, the sum over the batch's label tokens divided by the Trainer's `num_items_in_batch` (else their mean). The
head's trainable parameters (full fine-tuning, a LoRA on `lm_head`) get their gradients through autograd, summed
over the slices; dropout in the head draws the same mask in its recompute (checkpoint's RNG state). What the plan
decided (`Plan.tiled_loss_shards`) is carried out here, in the worker; the plan counts its memory without running it
(`ActivationProfile.loss_tiled`: one slice's log-probs and gradients) and refused what this can't do. No torch at
import.
"""

from __future__ import annotations

import math

MARK = "_ftune_tiled_loss"

VERIFIED = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "olmo2", "granite",
            "cohere", "smollm3", "llava", "idefics3")
"""The model types whose `*ForCausalLM.forward` (a VLM's `*ForConditionalGeneration.forward`: images go to its
`.model` with the text) is the decoder, then `lm_head`, then `logit_transform`'s, then transformers' causal-LM loss,
and nothing else (no router loss, no extra heads): the forward this replaces. tests/unit/test_tiled_loss.py checks
each one's loss and gradients against its own forward (the VLMs with an image in the row)."""


def shard_count(rule, tokens: int, hidden: int, vocab: int) -> int:
    """Slices of a row of `tokens` tokens: `rule`, or for `auto` the vocabulary / hidden size, rounded up (Liger's
    chunking: one slice's logits hold about as many values as the row's hidden states); never more than tokens."""
    return max(1, min(tokens, rule if rule != "auto" else math.ceil(vocab / max(hidden, 1))))


def text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def head(model):
    """The causal LM of `model` whose forward is tiled (a PeftModel's base model), or None without one: a module
    with a decoder (`.model`) and an output head (`.lm_head`)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base if hasattr(base, "lm_head") and hasattr(base, "model") else None


def apply(model, rule) -> bool:
    """Tile the loss of `model`'s causal LM (`head`) in place, in the slices `rule` gives (`Plan.tiled_loss_shards`).
    False when it was tiled already."""
    lm = head(model)
    if lm is None:
        raise ValueError(f"{type(model).__name__} has no causal LM head to tile")
    if getattr(lm, MARK, False):
        return False
    lm.forward = _tiled_forward(lm, lm.forward, rule)
    setattr(lm, MARK, True)
    return True


def remove(model) -> None:
    """Undo `apply`: the model's own forward again."""
    lm = head(model)
    if lm is not None and lm.__dict__.pop(MARK, None):
        lm.__dict__.pop("forward", None)


def _tiled_forward(lm, untiled, rule):
    """The causal LM's forward with the loss in slices wherever labels are given: training, and evaluation's loss
    too (the Trainer's evaluation keeps only the loss of a model without `compute_metrics`), so an eval batch of
    long rows holds no more than a training one. Without labels (generation, benchmarks' log-likelihoods) the
    model's own forward runs and returns its logits. It carries the forward's signature (`functools.wraps`):
    generation and the Trainer read which inputs the model takes from it (a VLM's `pixel_values`)."""
    import functools

    @functools.wraps(untiled)
    def forward(*args, **kwargs):
        labels, shift = kwargs.get("labels"), kwargs.get("shift_labels")
        if args or (labels is None and shift is None):
            return untiled(*args, **kwargs)  # generation, scoring: the model's own forward, with its logits
        from transformers.modeling_outputs import CausalLMOutputWithPast

        for key in ("labels", "shift_labels", "logits_to_keep", "return_dict"):
            kwargs.pop(key, None)
        items = kwargs.pop("num_items_in_batch", None)
        out = lm.model(**kwargs)
        loss = tiled_loss(lm, out.last_hidden_state, labels, shift, items, rule)
        return CausalLMOutputWithPast(loss=loss, logits=None, past_key_values=out.past_key_values,
                                      hidden_states=out.hidden_states, attentions=out.attentions)

    return forward


def tiled_loss(lm, hidden, labels, shift_labels, num_items_in_batch, rule):
    """transformers' causal-LM loss of `lm`'s head over `hidden` (batch, tokens, hidden size), in slices of the
    token dimension, each recomputed in backward."""
    import torch
    from torch.utils.checkpoint import checkpoint

    if shift_labels is None:
        shift_labels = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
    shift_labels = shift_labels.to(hidden.device)
    config = text_config(lm.config)
    n = shard_count(rule, hidden.shape[-2], hidden.shape[-1], config.vocab_size)
    transform = logit_transform(lm)

    def piece(h, y):
        logits = transform(lm.lm_head(h)).float()
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                                 ignore_index=-100, reduction="sum")

    # one split (one autograd node) for every slice: backward gathers the slices' gradients into one hidden-sized
    # tensor; autograd runs a later slice's whole recompute and backward before an earlier one's
    total = sum(checkpoint(piece, h, y, use_reentrant=False, preserve_rng_state=hidden.device.type != "meta")
                for h, y in zip(torch.tensor_split(hidden, n, dim=-2), torch.tensor_split(shift_labels, n, dim=-1)))
    if num_items_in_batch is not None:
        items = num_items_in_batch.to(total.device) if torch.is_tensor(num_items_in_batch) else num_items_in_batch
        return total / items
    return total / (shift_labels != -100).sum()


def logit_transform(lm):
    """What the family's forward does to `lm_head`'s output before the loss, read from its config: Gemma 2/3's
    final soft-capping, Cohere's `logit_scale`, Granite's `logits_scaling`; else nothing."""
    import torch

    config = text_config(lm.config)
    cap = getattr(config, "final_logit_softcapping", None)
    scale = getattr(lm, "logit_scale", None) if getattr(config, "model_type", "").startswith("cohere") else None
    divide = getattr(config, "logits_scaling", None) if getattr(config, "model_type", "") == "granite" else None

    def transform(logits):
        if scale is not None:
            logits = logits * scale
        if divide is not None:
            logits = logits / divide
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    return transform
