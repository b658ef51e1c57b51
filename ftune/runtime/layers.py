"""A shallower model built from a deeper one (`model.init_from`): the embeddings, final norm and head kept, and
the decoder layers listed, renumbered in order, in a config with `num_hidden_layers = len(layers)`.

Built in the worker's model stage from the Plan (`plan.model_load.layers`), after `from_pretrained` loaded the
source: the parent stays light (no torch in `plan` or `run`'s parent), nothing is written outside the run dir,
and every rank (and a resumed run) builds the same student from the same folder. final/ saves the student as a
plain model of the smaller config.
"""

from __future__ import annotations

from ftune.errors import FtuneError


def decoder_layers(model):
    """The ModuleList of the decoder's layers (`num_hidden_layers` long)."""
    import torch

    config = model.config.get_text_config()
    depth = config.num_hidden_layers
    found = [m for _, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) == depth]
    if len(found) != 1:
        raise FtuneError(f"model.init_from: can't find {type(model).__name__}'s one list of {depth} decoder layers "
                         f"(found {len(found)})",
                         hint="init_from supports decoder-only LMs (llama, qwen, mistral, ...)")
    return found[0]


def keep_layers(model, layers: list[int]):
    """`model` with only `layers` (increasing, in range: the recipe rules and the files tier checked them)."""
    import torch

    config = model.config.get_text_config()
    old = decoder_layers(model)
    kept = [old[i] for i in layers]
    # each attention module indexes the KV cache by its layer number: renumber them 0..n-1
    for j, layer in enumerate(kept):
        for module in layer.modules():
            if isinstance(getattr(module, "layer_idx", None), int):
                module.layer_idx = j
    parent_name = next(n for n, m in model.named_modules() if m is old).rpartition(".")
    parent = model.get_submodule(parent_name[0]) if parent_name[0] else model
    setattr(parent, parent_name[2], torch.nn.ModuleList(kept))
    config.num_hidden_layers = len(layers)
    if isinstance(getattr(config, "layer_types", None), list):  # sliding/full attention per layer (qwen, gemma)
        config.layer_types = [config.layer_types[i] for i in layers]
    return model
