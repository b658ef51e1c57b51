"""The tokenizer, from where the plan says (`plan.tokenizer_path`: `model.tokenizer`, else `model.path`)."""

from __future__ import annotations

from ftune.errors import FtuneError
from ftune.datafiles.prompts import decide


def load(path: str, recipe, token: str | None = None, prompt=None):
    """The tokenizer at `path`, ready for training (a pad token, right padding). Also used by `ftune data`.
    `prompt`: the run's prompt format (`Plan.prompt`; None: decided from the recipe, `ftune.datafiles.prompts`)."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(
            path,
            trust_remote_code=recipe.model.trust_remote_code,
            revision=recipe.model.revision,
            token=token,
        )
    except (OSError, ValueError) as err:
        from pathlib import Path

        from ftune.hub import looks_local

        if looks_local(path) and not Path(path).expanduser().exists():
            # transformers would read a missing folder as a hub repo id ("Repo id must be in the form ...")
            raise FtuneError(f"cannot load the tokenizer: the folder {path} does not exist (moved or deleted?)",
                             hint="put the model back at that path, or set model.path (or model.tokenizer) to where "
                             "it is now") from None
        _not_cached(path, recipe, "tokenizer")
        raise FtuneError(
            f"cannot load the tokenizer from {path}: {str(err).splitlines()[0]}",
            hint="model.path (or model.tokenizer) must hold tokenizer files (tokenizer.json / tokenizer_config.json)",
        ) from err
    apply_tokens(tok, recipe.model)
    if recipe.data.chat_template or (prompt or decide(recipe)).chat:
        from ftune.datastage import chat_template_of

        # the template the prompts are rendered with is saved with the tokenizer in final/, so inference formats
        # prompts the same way (ftune's default included, for a tokenizer that has none)
        tok.chat_template = chat_template_of(recipe, tok)
    if tok.pad_token is None:
        # Causal LMs often ship without a pad token; padding positions carry no loss, so EOS is safe.
        tok.pad_token = tok.eos_token or tok.unk_token
    tok.padding_side = "right"
    return tok


def apply_tokens(tok, model) -> None:
    """`model.special_tokens` and `model.add_tokens` on the tokenizer (a token not in the vocabulary is added;
    the model's embeddings are resized to match when it loads)."""
    special = model.special_tokens.model_dump(exclude_none=True) if model.special_tokens else {}
    if special:
        tok.add_special_tokens(special)
    if model.add_tokens:
        tok.add_tokens(list(model.add_tokens))


def trained_token_ids(tok, model) -> list[int]:
    """Ids whose embedding rows train: `model.add_tokens` and the special tokens set in the recipe (pad aside:
    padding carries no loss)."""
    special = model.special_tokens.model_dump(exclude_none=True) if model.special_tokens else {}
    names = list(model.add_tokens or []) + [v for k, v in special.items() if k != "pad_token"]
    return sorted({tok.convert_tokens_to_ids(t) for t in names})


def load_tokenizer(plan):
    return load(plan.tokenizer_path, plan.recipe, token=plan.secret("model.hub_token"), prompt=plan.prompt)


def _not_cached(path: str, recipe, what: str) -> None:
    """A hub id offline that the Hugging Face cache doesn't hold: the folder searched and the download command, as
    `validate --check-paths` and `run` say it (`ftune.hub`)."""
    from ftune import hub

    key = "model.tokenizer" if recipe.model.tokenizer else "model.path"
    problem = hub.missing(key, path, recipe.model.revision, "model" if key == "model.path" else "tokenizer",
                          hub.TOKENIZER_FILES)
    if problem is not None:
        raise FtuneError(f"cannot load the {what}: {problem.message}", hint=problem.hint) from None


PROCESSOR_HINT = ("a vision-language model's folder holds its processor: preprocessor_config.json (the image "
                  "processor), the tokenizer files and the chat template (set model.tokenizer where they live apart)")


def load_processor_at(path: str, recipe, token: str | None = None):
    """A vision-language model's processor (AutoProcessor: image processor + tokenizer) at `path`, its tokenizer
    prepared as `load` prepares one (special tokens, a pad token, right padding)."""
    from transformers import AutoProcessor

    try:
        proc = AutoProcessor.from_pretrained(path, trust_remote_code=recipe.model.trust_remote_code,
                                             revision=recipe.model.revision, token=token)
    except (OSError, ValueError, TypeError, AttributeError) as err:
        _not_cached(path, recipe, "processor")
        raise FtuneError(f"cannot load the processor from {path}: {str(err).splitlines()[0]}",
                         hint=PROCESSOR_HINT) from err
    if getattr(proc, "image_processor", None) is None or getattr(proc, "tokenizer", None) is None:
        raise FtuneError(f"{path} has no image processor (AutoProcessor gave a {type(proc).__name__})",
                         hint=PROCESSOR_HINT)
    tok = proc.tokenizer
    apply_tokens(tok, recipe.model)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    tok.padding_side = "right"
    return proc


def load_processor(plan):
    """The processor of `plan` (`model.task: image-text-to-text`), None for a text model."""
    if plan.recipe.model.task != "image-text-to-text":
        return None
    return load_processor_at(plan.tokenizer_path, plan.recipe, token=plan.secret("model.hub_token"))
