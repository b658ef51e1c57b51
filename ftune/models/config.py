"""A model's config with the recipe's task settings, its linear layers and the positions it covers, shared by both
sides: the meta-device build (`ftune.models.meta`: the preflight and the estimator, before launch) and the worker's
model stage. Heavy libraries are imported inside the functions."""

from __future__ import annotations

from ftune.errors import FtuneError

TASK_CLASSES = {
    "causal-lm": "AutoModelForCausalLM",
    "sequence-classification": "AutoModelForSequenceClassification",
    "image-text-to-text": "AutoModelForImageTextToText",
}


def load_config(recipe, token: str | None = None, labels: list[str] | None = None, path: str | None = None):
    """The model's config (from `path`, default `model.path`) with the recipe's task settings applied (labels for
    classification). Label names come from `model.labels`, else from the data (`labels`), else the config's count."""
    from transformers import AutoConfig

    model = recipe.model
    path = path or model.path
    try:
        config = AutoConfig.from_pretrained(
            path, trust_remote_code=model.trust_remote_code, revision=model.revision, token=token
        )
    except (OSError, ValueError) as err:
        raise FtuneError(
            f"cannot load the model config from {path}: {str(err).splitlines()[0]}",
            hint="model.path must be a folder with config.json (or a hub id where a hub is reachable)",
        ) from err
    return apply_task(config, recipe, labels)


def apply_task(config, recipe, labels: list[str] | None = None):
    """`config` with the recipe's task settings (the worker's load and the meta-device build alike): the labels of a
    classifier (`model.labels`, else the data's `labels`, else the config's count; a reward model's one logit) and
    `model.attn_implementation`."""
    model = recipe.model
    # the one name compared outside the objectives' modules: this room sits below ftune.recipe (the import graph),
    # so it can't ask the objective's family (Family.one_logit) without importing upward
    if model.task == "sequence-classification" and recipe.train.objective == "reward":
        labels = ["reward"]  # one logit: the reward
    if model.task == "sequence-classification":
        labels = model.labels or labels or [str(i) for i in range(model.num_labels or config.num_labels)]
        config.num_labels = len(labels)
        config.id2label = dict(enumerate(labels))
        config.label2id = {name: i for i, name in enumerate(labels)}
    if model.attn_implementation:
        config._attn_implementation = model.attn_implementation
    return config


def linear_layer_names(model) -> list[str]:
    """Distinct leaf names of the model's linear layers (what `target_modules` can name)."""
    import torch

    names = {name.rpartition(".")[2] for name, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)}
    return sorted(names)


STRETCHING_ROPE = ("linear", "dynamic", "yarn")
"""Rope scalings that stretch the positions a model was trained on by `factor`, written over an unchanged
max_position_embeddings (Qwen's YaRN configs); llama3 and longrope write the stretched length there themselves."""


def positions(config) -> tuple[int, str] | None:
    """The longest sequence the model's positions cover, and how it was found (for messages): a config object or
    its dict (a vision-language model's text config); None when the config names no length."""
    get = config.get if isinstance(config, dict) else lambda key: getattr(config, key, None)
    if get("max_position_embeddings") is None and get("text_config") is not None:
        return positions(get("text_config"))
    length = get("max_position_embeddings")
    if not isinstance(length, int) or length <= 0:
        return None
    rope = get("rope_parameters") or get("rope_scaling")
    rope = rope if isinstance(rope, dict) else {}
    factor = rope.get("factor")
    if rope.get("rope_type", rope.get("type")) in STRETCHING_ROPE and isinstance(factor, int | float) and factor > 1:
        original = rope.get("original_max_position_embeddings") or length
        stretched = int(original * factor)
        if stretched > length:
            return stretched, (f"{original} positions x {rope.get('rope_type', rope.get('type'))} rope scaling factor "
                               f"{factor:g}")
    return length, "max_position_embeddings"
