"""`model:` what is fine-tuned (its path, task, dtype, tokenizer, special tokens, layers it is built from)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from ftune.recipe.schema.base import Section


class SpecialTokens(Section):
    """Special tokens set on the tokenizer before training (and saved with it)."""

    pad_token: str | None = None
    """Padding token (never trained: padding carries no loss); default: the tokenizer's, else eos."""
    eos_token: str | None = None
    """End-of-sequence token: what ends an answer, so what generation stops on (e.g. `<|im_end|>` for chatml)."""
    bos_token: str | None = None
    """Beginning-of-sequence token."""
    unk_token: str | None = None
    """Unknown token."""


class InitFrom(Section):
    """A student built from a larger model of the same architecture: its embeddings, final norm and head, and the
    decoder layers listed, copied in order into a config with `num_hidden_layers: len(layers)`
    (docs/distillation.md)."""

    path: str
    """The model (a local folder or hub id, e.g. the teacher) whose layers are copied."""
    layers: list[int] = Field(min_length=1)
    """Indices of the decoder layers kept, increasing and each once (e.g. every other one: [0, 2, 4, ...])."""


class ModelSection(Section):
    path: str
    """Local folder with config.json (and weights unless `init: random`), or a hub id (from the hub; with
    `HF_HUB_OFFLINE=1`, from the Hugging Face cache only: docs/distributed.md); a `.gguf` file (see `gguf_file`); or a
    saved adapter folder (a run's `final/`): that adapter is trained on, over the base it names (`peft:` keys left
    unset are taken from it, set ones must agree); a merged folder (`ftune merge`) is a plain model."""
    gguf_file: str | None = None
    """A `.gguf` file inside the folder `path` names (or set `path` to the .gguf itself): ftune dequantizes it once
    into its cache (~/.cache/ftune/models, keyed by the file's sha256; FTUNE_MODEL_CACHE overrides) as a plain
    Hugging Face folder with its tokenizer and chat template, and trains on that (docs/gguf.md)."""
    task: Literal["causal-lm", "sequence-classification", "image-text-to-text"] = "causal-lm"
    """What the model is trained to do; `image-text-to-text`: a vision-language model (AutoModelForImageTextToText
    with its AutoProcessor) trained on `format: vision-chat` rows (docs/vision.md)."""
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "auto"
    """Dtype the weights are loaded in; `auto` takes the checkpoint's own (float32 when unset)."""
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2", "flex_attention"] | None = None
    """Attention kernel; default: transformers' choice (sdpa where available)."""
    trust_remote_code: bool = False
    """Run modelling code shipped with the checkpoint. Off unless the recipe sets it."""
    init: Literal["pretrained", "random"] = "pretrained"
    """`pretrained` loads the weights; `random` builds the model from the folder's config (from-scratch runs)."""
    revision: str | None = None
    """Hub revision (branch, tag or commit) when `path` is a hub id; offline, the cache's snapshot at that
    revision (the tokenizer's too)."""
    config: str | None = None
    """A local config.json (or a folder holding one) that `ftune plan` builds the model from when `path` has
    none of its own: `path` as a local folder, then the offline HF cache, then this, then the bundled catalog."""
    tokenizer: str | None = None
    """Tokenizer folder or hub id; default: `path`."""
    num_labels: int | None = Field(None, ge=2)
    """Number of classes for `task: sequence-classification`; default: len(labels)."""
    labels: list[str] | None = None
    """Class names for `task: sequence-classification`, in id order."""
    hub_token: str | None = None
    """Hub access token; write `${env:HF_TOKEN}` so it is read from the environment and masked in outputs."""
    special_tokens: SpecialTokens | None = None
    """Override the tokenizer's special tokens (a token not in the vocabulary is added, as with add_tokens)."""
    router_aux_loss_coef: float | None = Field(None, ge=0.0)
    """Mixture-of-experts models: weight of the router's load-balancing loss added to the training loss (the
    config's `router_aux_loss_coef`); setting it turns on `output_router_logits`. Default: the model's own."""
    output_router_logits: bool | None = None
    """Mixture-of-experts models: compute the router's load-balancing loss (added to the loss, logged as
    `aux_loss` in metrics.jsonl). Default: on when `router_aux_loss_coef` is set, else the model's config."""
    init_from: InitFrom | None = None
    """Build the model from another one's layers (`{path, layers}`; `model.path` may then be left out: it is
    `init_from.path`), e.g. a distillation student half as deep as its teacher. Built in the worker's model stage
    from the Plan (`plan.model_load.layers`)."""
    add_tokens: list[str] | None = None
    """Tokens added to the vocabulary (e.g. chat markers `<|im_start|>`); the embeddings are resized and the rows
    of these tokens (and of the special tokens set here, pad aside) train — with LoRA, saved with the adapter
    (the whole matrices instead when peft.modules_to_save names the embedding and head)."""

    @model_validator(mode="before")
    @classmethod
    def _path_from_init(cls, data: Any) -> Any:
        """`init_from: {path: P, layers: [...]}` without `path`: the model is P's, so `path` is P (its config, its
        tokenizer); a recipe that writes both must write the same folder (`ftune.recipe.rules.distill`)."""
        if isinstance(data, dict) and "path" not in data and isinstance(data.get("init_from"), dict) \
                and isinstance(data["init_from"].get("path"), str):
            return {**data, "path": data["init_from"]["path"]}
        return data
