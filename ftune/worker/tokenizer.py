"""Stage 1: the tokenizer, from where the plan says (`plan.tokenizer_path`: `model.tokenizer`, else `model.path`)."""

from __future__ import annotations

from ftune.errors import FtuneError


def load(path: str, recipe, token: str | None = None):
    """The tokenizer at `path`, ready for training (a pad token, right padding). Also used by `ftune data`."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(
            path,
            trust_remote_code=recipe.model.trust_remote_code,
            revision=recipe.model.revision,
            token=token,
        )
    except (OSError, ValueError) as err:
        raise FtuneError(
            f"cannot load the tokenizer from {path}: {str(err).splitlines()[0]}",
            hint="model.path (or model.tokenizer) must hold tokenizer files (tokenizer.json / tokenizer_config.json)",
        ) from err
    if tok.pad_token is None:
        # Causal LMs often ship without a pad token; padding positions carry no loss, so EOS is safe.
        tok.pad_token = tok.eos_token or tok.unk_token
    tok.padding_side = "right"
    return tok


def load_tokenizer(plan):
    return load(plan.tokenizer_path, plan.recipe, token=plan.secret("model.hub_token"))
