"""Tiled MLP (`train.tiled_mlp`), the long-context lever of Arctic Long Sequence Training (ALST, Bekman et al.
2025): each decoder layer's MLP runs over its tokens in `shards` slices. Forward computes every slice without
autograd and keeps only the MLP's input; backward recomputes one slice at a time with autograd on and frees it
before the next. The MLP's intermediates (gate, up, activation: 3 x intermediate_size values a token on a Llama,
~3.5x the hidden state) then never exist for more than one slice at once.

The MLP's trainable parameters are inputs of the autograd function, so their gradients (summed over the slices)
reach them once, through autograd's own accumulation, as an untiled MLP's do: DDP's and FSDP's gradient hooks see
one gradient per parameter per backward. Each slice's forward runs under the RNG state it had in forward (dropout
on LoRA's input draws the same mask twice) and the autocast state of forward. What the plan decided (the shard
count, `Plan.tiled_mlp_shards`) is carried out here, in the worker and in `ftune plan`'s meta step
(`ftune.estimate.step_probe`); the plan refused what this can't do (MoE blocks, DeepSpeed). No torch at import.
"""

from __future__ import annotations

import math

MARK = "_ftune_tiled_mlp"


def _autograd_function():
    import torch

    class TiledMLP(torch.autograd.Function):
        @staticmethod
        def forward(ctx, run, shards: int, x, *params):
            ctx.run, ctx.shards = run, shards
            ctx.autocast = _autocast_state(x.device.type)
            ctx.rng = []
            outs = []
            with torch.no_grad():
                for piece in torch.chunk(x, shards, dim=-2):
                    ctx.rng.append(_rng_state(x.device))
                    outs.append(run(piece))
            ctx.save_for_backward(x, *params)
            return torch.cat(outs, dim=-2)

        @staticmethod
        def backward(ctx, grad):
            x, *params = ctx.saved_tensors
            wanted = [p for p, needs in zip(params, ctx.needs_input_grad[3:]) if needs]
            grads = [None] * len(wanted)
            grad_x = torch.empty_like(x) if ctx.needs_input_grad[2] else None
            start = 0
            for piece, grad_piece, rng in zip(torch.chunk(x, ctx.shards, dim=-2), torch.chunk(grad, ctx.shards, dim=-2),
                                              ctx.rng):
                width = piece.shape[-2]
                piece = piece.detach().requires_grad_(grad_x is not None)
                with torch.enable_grad(), _restored_rng(x.device, rng), _autocast(x.device.type, ctx.autocast):
                    out = ctx.run(piece)
                inputs = ([piece] if grad_x is not None else []) + wanted
                found = torch.autograd.grad(out, inputs, grad_piece, allow_unused=True)
                if grad_x is not None:
                    grad_x.narrow(-2, start, width).copy_(found[0])
                    found = found[1:]
                grads = [g if f is None else f if g is None else g.add_(f) for g, f in zip(grads, found)]
                start += width
                del out, found
            it = iter(grads)
            return (None, None, grad_x, *(next(it) if needs else None for needs in ctx.needs_input_grad[3:]))

    return TiledMLP


_FUNCTION = None


def tiled(run, shards: int, x, params):
    """`run(x)` (the MLP's own forward) over `shards` slices of x's token dimension (-2), with `params` (its
    trainable parameters) given their gradients through autograd."""
    global _FUNCTION
    if _FUNCTION is None:
        _FUNCTION = _autograd_function()
    return _FUNCTION.apply(run, shards, x, *params)


def apply(mlps: list, rule) -> int:
    """Tile each module of `mlps` (`ftune.plan.tiling.mlps`: the decoder layers' MLPs) in place, in the slices
    `rule` gives (`Plan.tiled_mlp_shards`). Done once the trainer is built: its Liger kernels patch the MLP's forward
    per instance, and the slices then run Liger's. Returns how many were tiled."""
    done = 0
    for mlp in mlps:
        if getattr(mlp, MARK, False):
            continue
        mlp.forward = _tiled_forward(mlp, mlp.forward, rule)
        setattr(mlp, MARK, True)
        done += 1
    return done


def slices(rule, tokens: int, hidden: int) -> int:
    """Slices of one MLP call over `tokens` tokens (its input's second-to-last dimension): `rule`, or for `auto`
    the tokens / hidden size, rounded up (ALST's rule); never more slices than tokens."""
    return max(1, min(tokens, rule if rule != "auto" else math.ceil(tokens / max(hidden, 1))))


def _tiled_forward(mlp, untiled, rule):
    import torch

    def forward(x, *args, **kwargs):
        if args or kwargs or not torch.is_grad_enabled():  # eval, generation: nothing kept for backward anyway
            return untiled(x, *args, **kwargs)
        params = [p for p in mlp.parameters() if p.requires_grad]
        if not params and not x.requires_grad:
            return untiled(x)
        return tiled(untiled, slices(rule, x.shape[-2], x.shape[-1]), x, params)

    return forward


def _autocast_state(device_type: str):
    import torch

    if not torch.amp.is_autocast_available(device_type) or not torch.is_autocast_enabled(device_type):
        return None  # the meta device (`ftune plan`'s probe) has no autocast
    return torch.get_autocast_dtype(device_type)


def _autocast(device_type: str, dtype):
    import contextlib

    import torch

    if dtype is None:
        on = torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)
        return torch.autocast(device_type, enabled=False) if on else contextlib.nullcontext()
    return torch.autocast(device_type, dtype=dtype)


def _rng_state(device):
    import torch

    cpu = torch.get_rng_state()
    return cpu, torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _restored_rng(device, state):
    import contextlib

    import torch

    @contextlib.contextmanager
    def restored():
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, device_type="cuda" if devices else "cpu"):
            torch.set_rng_state(state[0])
            if state[1] is not None:
                torch.cuda.set_rng_state(state[1], device)
            yield

    return restored()
