"""Stop tokens: EOS and the end-of-turn tokens a chat template writes, and whether training ever teaches them.

A model trained on completions whose labels never hold EOS or an end-of-turn token does not learn to end
its answer, and generation then runs to `max_new_tokens`. `ftune data` and `ftune run` warn about it.
"""

from __future__ import annotations

from collections.abc import Iterable

from ftune.worker.data.masking import IGNORE

END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
               "</s>", "<|eom_id|>")
"""End-of-turn tokens of common chat templates; one stops generation when it is in the vocabulary and the
run's chat template writes it."""
CHECKED_ROWS = 1000


def stop_token_ids(tokenizer, chat_template: str | None = None, extra: Iterable[int] = ()) -> list[int]:
    """EOS, the end-of-turn tokens `chat_template` writes, and `extra` (a model's generation config)."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    vocab = tokenizer.get_vocab()
    for token in END_OF_TURN:
        if token in vocab and chat_template is not None and token in chat_template:
            ids.append(vocab[token])
    ids += [int(i) for i in extra]
    return list(dict.fromkeys(ids))


def untrained_stop_warning(recipe, tokenizer, train, chat_template: str) -> str | None:
    """A warning when completion-only instruction/chat training never labels a stop token (first rows checked)."""
    formats = {s.format for s in recipe.data.train}
    if recipe.model.task != "causal-lm" or recipe.data.train_on != "completion" or not formats & {"instruction", "chat"}:
        return None
    stops = set(stop_token_ids(tokenizer, chat_template if "chat" in formats else None))
    rows = train.select(range(min(CHECKED_ROWS, len(train)))) if hasattr(train, "select") else train[:CHECKED_ROWS]
    checked = 0
    for row in rows:
        labels = [t for t in row["labels"] if t != IGNORE]
        if not labels:
            continue
        checked += 1
        if stops & set(labels):
            return None
    if not checked:
        return None
    names = ", ".join(tokenizer.convert_ids_to_tokens(sorted(stops))) or "none: the tokenizer has no eos_token"
    return (f"no trained token is a stop token ({names}) in the first {checked} training rows: the model will not "
            "learn to end its answer, and `ftune generate` would run to --max-new-tokens. Make the chat template end "
            "each assistant turn with eos_token or an end-of-turn token, or give the tokenizer an eos_token")
