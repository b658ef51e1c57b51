"""Stage 3: the model — loaded from a local folder (or hub id), or built from its config (`init: random`)."""

from __future__ import annotations

from ftune.errors import FtuneError

TASK_CLASSES = {
    "causal-lm": "AutoModelForCausalLM",
    "sequence-classification": "AutoModelForSequenceClassification",
}


def _dtype(name: str):
    import torch

    return "auto" if name == "auto" else getattr(torch, name)


def load_config(recipe, token: str | None = None, labels: list[str] | None = None):
    """The model's config with the recipe's task settings applied (labels for classification).

    Label names come from `model.labels`, else from the data (`labels`), else the config's own count."""
    from transformers import AutoConfig

    model = recipe.model
    try:
        config = AutoConfig.from_pretrained(
            model.path, trust_remote_code=model.trust_remote_code, revision=model.revision, token=token
        )
    except (OSError, ValueError) as err:
        raise FtuneError(
            f"cannot load the model config from {model.path}: {str(err).splitlines()[0]}",
            hint="model.path must be a folder with config.json (or a hub id where a hub is reachable)",
        ) from err
    if model.task == "sequence-classification":
        labels = model.labels or labels or [str(i) for i in range(model.num_labels or config.num_labels)]
        config.num_labels = len(labels)
        config.id2label = dict(enumerate(labels))
        config.label2id = {name: i for i, name in enumerate(labels)}
    if model.attn_implementation:
        config._attn_implementation = model.attn_implementation
    return config


def build_meta_model(recipe):
    """The model on the meta device: shapes and names only, no weights read, no memory used."""
    import transformers
    from accelerate import init_empty_weights

    config = load_config(recipe)
    cls = getattr(transformers, TASK_CLASSES[recipe.model.task])
    with init_empty_weights():
        return cls.from_config(config, trust_remote_code=recipe.model.trust_remote_code)


def load_model(plan, tokenizer, quantization_config=None, labels: list[str] | None = None):
    import transformers
    from transformers import set_seed

    recipe = plan.recipe
    spec = recipe.model
    token = plan.secret("model.hub_token")
    config = load_config(recipe, token, labels)
    if config.pad_token_id is None and tokenizer.pad_token_id is not None:
        config.pad_token_id = tokenizer.pad_token_id
    cls = getattr(transformers, TASK_CLASSES[spec.task])
    kwargs = {"dtype": _dtype(plan.torch_dtype), "trust_remote_code": spec.trust_remote_code}
    if spec.attn_implementation:
        kwargs["attn_implementation"] = spec.attn_implementation
    if spec.init == "random":
        set_seed(recipe.train.seed)
        model = cls.from_config(config, **kwargs)
    else:
        if quantization_config is not None:
            kwargs["quantization_config"] = quantization_config
        # from_pretrained builds on the meta device and materialises weights as they load.
        model = cls.from_pretrained(spec.path, config=config, revision=spec.revision, token=token, **kwargs)
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer))
    return model


def linear_layer_names(model) -> list[str]:
    """Distinct leaf names of the model's linear layers (what `target_modules` can name)."""
    import torch

    names = {name.rpartition(".")[2] for name, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)}
    return sorted(names)
