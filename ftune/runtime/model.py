"""The model, loaded exactly as `plan.model_load` says (from a folder or hub id, or built from its
config for `init: random`). The kwargs are passed through unchanged; only the hub token (a secret, never in
the Plan) and the label names found in the data are added here."""

from __future__ import annotations

from ftune.models.config import load_config


def load_model(plan, tokenizer, labels: list[str] | None = None, spec=None):
    """The model for `plan` (or for `spec`, a ModelLoad such as `ftune eval` builds for a recorded quantization)."""
    import transformers
    from transformers import set_seed

    recipe = plan.recipe
    spec = spec or plan.model_load
    token = plan.secret("model.hub_token")
    config = load_config(recipe, token, labels, path=spec.path)
    for key, value in spec.config.items():  # the router's loss settings (plan.model_load.config)
        setattr(config, key, value)
    if getattr(config, "pad_token_id", 0) is None and tokenizer.pad_token_id is not None:  # a VLM's lives in text_config
        config.pad_token_id = tokenizer.pad_token_id
    cls = getattr(transformers, spec.auto_class)
    if spec.init == "random":
        set_seed(recipe.train.seed)
        model = cls.from_config(config, **spec.kwargs)
    else:
        # from_pretrained builds on the meta device and materialises weights as they load.
        extra = {}
        if spec.distributed:  # tensor parallelism: the weights are split over the ranks as they load
            from transformers.distributed.configuration_utils import DistributedConfig

            extra["distributed_config"] = DistributedConfig(**spec.distributed)
        model = cls.from_pretrained(spec.path, config=config, token=token, **spec.kwargs, **extra)
        if spec.layers is not None:  # model.init_from: a student of these layers
            from ftune.runtime.layers import keep_layers

            model = keep_layers(model, spec.layers)
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer))
    return model
