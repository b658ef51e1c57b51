"""How the model is loaded, decided by the compiler: the auto class and the exact `from_pretrained` kwargs."""

from __future__ import annotations

from typing import Any

from ftune.models.config import TASK_CLASSES
from ftune.plan.plan import ModelLoad
from ftune.plan.quantization import bnb_config
from ftune.recipe.schema import Recipe


def model_load(recipe: Recipe, quantization=None, path: str | None = None, adapter: str | None = None) -> ModelLoad:
    """The recipe's model as loaded (`quantization` and `path` override the recipe's, as `ftune eval` needs;
    `adapter`: a saved adapter the peft stage continues)."""
    m = recipe.model
    q = recipe.kbit if quantization is None else quantization
    kwargs: dict[str, Any] = {"dtype": m.dtype, "trust_remote_code": m.trust_remote_code}
    layout = recipe.distributed.parallelism
    if m.attn_implementation:
        kwargs["attn_implementation"] = m.attn_implementation
    elif layout is not None and layout.cp > 1:
        kwargs["attn_implementation"] = "sdpa"  # context parallelism splits sequences through SDPA only
    init = "pretrained" if path is not None else m.init
    if init == "pretrained":
        if m.revision is not None and path is None:
            kwargs["revision"] = m.revision
        if q is not None:
            kwargs["quantization_config"] = bnb_config(q)
    sharded = None
    if layout is not None and path is None:  # `ftune eval` (a path) loads final/ whole
        from ftune.plan.parallelism import decide

        sharded = decide(recipe).load_kwargs()
    return ModelLoad(auto_class=TASK_CLASSES[m.task], path=path or m.path, init=init, kwargs=kwargs,
                     config=router_config(recipe), adapter=adapter, distributed=sharded,
                     layers=list(m.init_from.layers) if m.init_from is not None and path is None else None)


def router_config(recipe: Recipe) -> dict[str, Any]:
    """The MoE router's config attributes the recipe sets: a load-balancing weight turns the loss on."""
    m = recipe.model
    out: dict[str, Any] = {}
    if m.router_aux_loss_coef is not None:
        out["router_aux_loss_coef"] = m.router_aux_loss_coef
        out["output_router_logits"] = True
    if m.output_router_logits is not None:
        out["output_router_logits"] = m.output_router_logits
    return out
