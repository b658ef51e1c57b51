"""Mixture-of-experts training details: the router's load-balancing loss and the per-expert token share, logged to
metrics.jsonl at each log (`aux_loss`, `expert_share_max`, `expert_share`), and the router-collapse guard
(`train.router_collapse`) that stops a run whose router sends nearly every token to one expert.

Forward hooks read what the model computes anyway (the routers' chosen experts, the model output's `aux_loss`):
no extra forward pass, nothing in a dense model's run. Counts are summed over all ranks at each log, so every
rank sees the same share and stops at the same step. The hooks count on the device (a scatter-add, and the aux
loss added to a device tensor): reading a count on the host in every layer's forward would wait for the GPU there,
48 times a forward on a 48-layer model, and stop the host from queueing kernels ahead. The host reads them once
a log.
"""

from __future__ import annotations

from ftune.errors import RunError
from ftune.models.moe import moe_layout


def router_stats(plan, model):
    """The callback for an MoE `model` (None for a dense one)."""
    from transformers import TrainerCallback

    layout = moe_layout(model)
    if layout is None:
        return None
    guard = plan.recipe.train.router_collapse
    experts = layout.num_experts
    routers = set(layout.router_modules)

    class RouterStats(TrainerCallback):
        def __init__(self) -> None:
            self.counts: dict[str, object] = {}  # router -> a device tensor of tokens per expert
            self.tokens: dict[str, int] = {}
            self.aux_sum, self.aux_n = 0.0, 0
            self.streak = 0
            self.handles: list = []

        def _route_hook(self, name: str):
            def hook(module, args, output):
                if not module.training:
                    return
                indices = next((t for t in reversed(output if isinstance(output, tuple) else (output,))
                                if hasattr(t, "dtype") and not t.dtype.is_floating_point), None)
                if indices is None:
                    return
                import torch

                flat = indices.detach().reshape(-1)  # bincount would read the largest index on the host: a sync
                mine = self.counts.get(name)
                if mine is None:
                    mine = self.counts[name] = torch.zeros(experts, dtype=torch.int64, device=flat.device)
                mine.scatter_add_(0, flat.to(torch.int64), torch.ones_like(flat, dtype=torch.int64))
                self.tokens[name] = self.tokens.get(name, 0) + indices.shape[0]
            return hook

        def _aux_hook(self, module, args, output):
            aux = getattr(output, "aux_loss", None)
            if module.training and aux is not None:
                self.aux_sum = self.aux_sum + aux.detach().float()  # a device tensor once the first one is added
                self.aux_n += 1

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            from ftune.models.moe import base_name

            if model is None:
                return
            inner = model.get_base_model() if hasattr(model, "get_base_model") else model
            self.handles.append(inner.register_forward_hook(self._aux_hook))
            for name, module in model.named_modules():
                if ".base_layer" not in name and base_name(name) in routers:
                    self.handles.append(module.register_forward_hook(self._route_hook(base_name(name))))

        def on_train_end(self, args, state, control, **kwargs):
            for h in self.handles:
                h.remove()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs is None or "loss" not in logs:
                return
            counts, tokens, aux = self._gathered(args)
            self.counts, self.tokens, self.aux_sum, self.aux_n = {}, {}, 0.0, 0
            if aux is not None:
                logs["aux_loss"] = aux
            if not tokens:
                return
            shares = {name: [c / max(tokens[name], 1) for c in row] for name, row in counts.items()}
            top_layer, top = max(((n, max(row)) for n, row in shares.items()), key=lambda x: x[1])
            logs["expert_share_max"] = round(top, 4)
            logs["expert_share"] = [round(sum(row[e] for row in shares.values()) / len(shares), 4)
                                    for e in range(experts)]
            if guard is None:
                return
            self.streak = self.streak + 1 if top > guard.max_share else 0
            if self.streak >= guard.logs:
                expert = shares[top_layer].index(top)
                raise RunError(
                    f"router collapse: in {top_layer}, expert {expert} received {top:.0%} of the tokens for "
                    f"{self.streak} logs in a row (train.router_collapse.max_share {guard.max_share:g}), at step "
                    f"{state.global_step}",
                    hint="raise model.router_aux_loss_coef (the load-balancing loss), lower the learning rate or "
                         "keep the router frozen (peft.router); train.router_collapse: null turns the guard off")

        def _gathered(self, args):
            """Counts, tokens and the mean aux loss, summed over every rank."""
            import torch

            names = sorted(routers)
            device = args.device if args.world_size > 1 else "cpu"  # the collective's device; one host read after
            parts = [self.counts[n].to(device, torch.float64) if n in self.counts
                     else torch.zeros(experts, dtype=torch.float64, device=device) for n in names]
            aux = torch.as_tensor(self.aux_sum, dtype=torch.float64).reshape(1).to(device)
            tokens = torch.tensor([self.tokens.get(n, 0) for n in names], dtype=torch.float64, device=device)
            t = torch.cat([*parts, tokens, aux, torch.tensor([float(self.aux_n)], dtype=torch.float64, device=device)])
            if args.world_size > 1:
                import torch.distributed as dist

                dist.all_reduce(t)
            flat = t.tolist()
            k = len(names) * experts
            counts = {n: flat[i * experts:(i + 1) * experts] for i, n in enumerate(names)}
            tokens = {n: flat[k + i] for i, n in enumerate(names) if flat[k + i]}
            aux_sum, aux_n = flat[-2], flat[-1]
            return ({n: counts[n] for n in tokens}, tokens, round(aux_sum / aux_n, 6) if aux_n else None)

    return RouterStats()
