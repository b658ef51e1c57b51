"""Loss masking: which tokens carry loss (labels) and which are -100, truncation, trainable counts.

Causal-LM losses shift labels by one, so the first token of a sample is never a target: a sample's
trainable count is the number of labels after the first that are not -100. A sample with none is
dropped (and counted); `data.max_dropped_fraction` turns too many drops into an error.
"""

from __future__ import annotations

from bisect import bisect_left

IGNORE = -100


def truncate(ids: list[int], labels: list[int], max_len: int | None) -> tuple[list[int], list[int]]:
    """Keep the first `max_len` tokens (right truncation: the prompt survives, the tail is cut)."""
    if max_len is None or len(ids) <= max_len:
        return ids, labels
    return ids[:max_len], labels[:max_len]


def trainable(labels: list[int]) -> int:
    """Tokens that are targets of the shifted causal-LM loss."""
    return sum(1 for x in labels[1:] if x != IGNORE)


def prompt_completion_labels(prompt: list[int], completion: list[int], train_on: str) -> list[int]:
    """Labels for `prompt + completion`: the completion only, or everything."""
    if train_on == "all":
        return prompt + completion
    return [IGNORE] * len(prompt) + completion


def labels_from_spans(ids: list[int], offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """Labels that keep tokens starting inside a trained character span, -100 elsewhere.

    `offsets` are the tokenizer's (start, end) character offsets; spans are sorted and disjoint.
    """
    if not spans:
        return [IGNORE] * len(ids)
    starts = [s for s, _ in spans]
    labels = []
    for tok, (s, e) in zip(ids, offsets):
        k = bisect_left(starts, s + 1) - 1  # last span starting at or before s
        inside = k >= 0 and s < spans[k][1] and e > s
        labels.append(tok if inside else IGNORE)
    return labels
