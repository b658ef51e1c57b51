"""Stop tokens: what generation can end on, and whether every trained answer ends with one.

The silent failure it catches: trained only on responses (train_on: completion), a model whose answers'
end-of-turn token carries no loss never learns to stop, and generation runs to max_new_tokens. A stop is
eos_token, or a known end-of-turn marker (<|im_end|>, <|eot_id|>, <end_of_turn>, <|end|>, ...) that is one
token of this tokenizer; a marker split into pieces by the tokenizer is no stop (generation can't end on it).
"""

from __future__ import annotations

from collections.abc import Iterable

from ftune.chat import KNOWN_STOPS
from ftune.datafiles.masking import IGNORE

CHECKED_ROWS = 500


def stop_ids(tok) -> dict[int, str]:
    """Token id -> text of every token generation can stop on."""
    vocab = tok.get_vocab()
    stops = {vocab[t]: t for t in KNOWN_STOPS if t in vocab}
    if tok.eos_token_id is not None:
        stops[tok.eos_token_id] = tok.eos_token
    return stops


def stop_token_ids(tokenizer, chat_template: str | None = None, extra: Iterable[int] = ()) -> list[int]:
    """What generation stops on: EOS, the end-of-turn markers `chat_template` writes, and `extra` (a model's
    generation config)."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    ids += [i for i, text in stop_ids(tokenizer).items() if chat_template is not None and text in chat_template]
    ids += [int(i) for i in extra]
    return list(dict.fromkeys(ids))


def count_unstopped(enc, stops: dict[int, str], max_len: int | None) -> tuple[int, int]:
    """(trained spans, spans whose last trained token is no stop) over the first CHECKED_ROWS rows of `enc`
    (input_ids, labels, _len); a span cut by truncation is not counted."""
    turns = unstopped = 0
    rows = enc.select(range(min(len(enc), CHECKED_ROWS)))
    for labels, length in zip(rows["labels"], rows["_len"]):
        truncated = max_len is not None and length > max_len
        end = len(labels)
        k = 1  # the first token is never a target
        while k < end:
            if labels[k] == IGNORE:
                k += 1
                continue
            j = k
            while j < end and labels[j] != IGNORE:
                j += 1
            if not (truncated and j == end):
                turns += 1
                unstopped += labels[j - 1] not in stops
            k = j
    return turns, unstopped
