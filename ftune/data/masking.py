"""Loss masking: which tokens carry loss (labels) and which are -100, truncation, trainable counts.

Causal-LM losses shift labels by one, so the first token of a sample is never a target: a sample's
trainable count is the number of labels after the first that are not -100. A sample with none is
dropped (and counted); `data.max_dropped_fraction` turns too many drops into an error.
"""

from __future__ import annotations

from bisect import bisect_left

IGNORE = -100
_PAST = float("inf")  # past the last span


def truncate(ids: list[int], labels: list[int], max_len: int | None) -> tuple[list[int], list[int]]:
    """Keep the first `max_len` tokens (right truncation: the prompt survives, the tail is cut)."""
    if max_len is None or len(ids) <= max_len:
        return ids, labels
    return ids[:max_len], labels[:max_len]


def trainable(labels: list[int]) -> int:
    """Tokens that are targets of the shifted causal-LM loss."""
    return max(0, len(labels) - 1 - labels.count(IGNORE) + (labels[0] == IGNORE)) if labels else 0


def prompt_completion_labels(prompt: list[int], completion: list[int], train_on: str) -> list[int]:
    """Labels for `prompt + completion`: the completion only, or everything."""
    if train_on == "all":
        return prompt + completion
    return [IGNORE] * len(prompt) + completion


def labels_from_spans(ids: list[int], offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """Labels that keep tokens starting inside a trained character span, -100 elsewhere.

    `offsets` are the tokenizer's (start, end) character offsets; spans are sorted and disjoint. Tokens come in
    text order, so one walk over tokens and spans together decides each (a bisect per token where a tokenizer
    gives offsets out of order).
    """
    labels = [IGNORE] * len(ids)
    if not spans:
        return labels
    k, n = 0, len(spans)
    start, end = spans[0]
    previous = 0
    for t, (s, e) in enumerate(offsets):
        if s < previous:
            return _labels_by_bisect(ids, offsets, spans)
        previous = s
        while s >= end:  # the current span ends before this token starts
            k += 1
            start, end = spans[k] if k < n else (_PAST, _PAST)
        if start <= s and e > s:
            labels[t] = ids[t]
    return labels


def _labels_by_bisect(ids, offsets, spans) -> list[int]:
    starts = [s for s, _ in spans]
    labels = []
    for tok, (s, e) in zip(ids, offsets):
        k = bisect_left(starts, s + 1) - 1  # last span starting at or before s
        inside = k >= 0 and s < spans[k][1] and e > s
        labels.append(tok if inside else IGNORE)
    return labels
