"""The built-in rewards: each `make(args)` returns `score(sample) -> float` (see `ftune.rewards`).

Text is compared normalised: stripped, lower-cased, runs of whitespace as one space, and trailing `.`/`!`/`?`
dropped. Pure Python, except TRL's rewards, imported from trl when a recipe names them.
"""

from __future__ import annotations

import json
import math
import re

from ftune.rewards import Sample

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def normalise(text) -> str:
    return re.sub(r"\s+", " ", str(text)).strip().lower().rstrip(".!?").strip()


def exact_match(args):
    """1 when the normalised completion equals the normalised answer, else 0."""
    return lambda s: float(normalise(s.completion) == normalise(s.answer))


def contains(args):
    """1 when the normalised completion contains the normalised answer (or `text`), else 0."""
    fixed = None if args.text is None else normalise(args.text)
    return lambda s: float((fixed if fixed is not None else normalise(s.answer)) in normalise(s.completion))


def last_number(text: str) -> float | None:
    found = NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def numeric(args):
    """1 when the last number in the completion is within `tolerance` of the answer (a number, or text whose last
    number is it), else 0 (also when the completion has no number)."""

    def score(s: Sample) -> float:
        want = s.answer if isinstance(s.answer, (int, float)) else last_number(str(s.answer))
        if want is None:
            raise ValueError(f"the answer {s.answer!r} holds no number")
        got = last_number(s.completion)
        return float(got is not None and abs(got - float(want)) <= args.tolerance)

    return score


def regex(args):
    """1 when the completion matches `pattern` (searched; with `full`, the whole stripped completion), else 0."""
    pattern = re.compile(args.pattern, re.DOTALL)
    if args.full:
        return lambda s: float(pattern.fullmatch(s.completion.strip()) is not None)
    return lambda s: float(pattern.search(s.completion) is not None)


def choice(args):
    """1 when the first option letter standing alone in the completion (`B`, `(B)`, `B.`) is the answer's."""
    letters = re.escape(args.choices.upper())
    pattern = re.compile(rf"(?<![A-Za-z0-9])([{letters}])(?![A-Za-z0-9])")

    def score(s: Sample) -> float:
        found = pattern.search(s.completion.upper())
        return float(found is not None and found.group(1) == normalise(s.answer).upper().strip("()"))

    return score


def json_object(args):
    """1 when the completion (stripped, a ```json fence removed) parses as a JSON object with every `required`
    key, else 0."""
    fence = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)

    def score(s: Sample) -> float:
        text = s.completion.strip()
        if (m := fence.match(text)) is not None:
            text = m.group(1)
        try:
            value = json.loads(text)
        except ValueError:
            return 0.0
        return float(isinstance(value, dict) and all(k in value for k in args.required))

    return score


def length(args):
    """-penalty x |completion tokens - target|: 0 at the target, lower the further away."""
    return lambda s: -args.penalty * abs(s.completion_tokens - args.target)


def _trl_one(func):
    """A TRL reward (batched: completions=[...]) on one completion."""
    def score(s: Sample) -> float:
        value = func(completions=[s.completion], completion_ids=[list(s.completion_ids)])[0]
        return math.nan if value is None else float(value)

    return score


def think_format(args):
    """TRL's think_format_reward: 1 when the completion is `<think>...</think>` then an answer."""
    from trl.rewards import think_format_reward

    return lambda s: float(think_format_reward([[{"content": s.completion}]])[0])


def repetition_penalty(args):
    """TRL's get_repetition_penalty_reward(ngram_size, max_penalty): negative for repeated n-grams."""
    from trl.rewards import get_repetition_penalty_reward

    return _trl_one(get_repetition_penalty_reward(ngram_size=args.ngram_size, max_penalty=args.max_penalty))


def soft_overlong_punishment(args):
    """TRL's get_soft_overlong_punishment(max_completion_len, soft_punish_cache): negative near the length limit."""
    from trl.rewards import get_soft_overlong_punishment

    return _trl_one(get_soft_overlong_punishment(args.max_completion_len, args.soft_punish_cache))
