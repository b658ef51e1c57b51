"""Regular expressions that can run for hours: `backtracks(pattern)` finds the shapes that backtrack
catastrophically in Python's engine, on the parsed pattern. The `regex` reward refuses them at `validate`; the
`regex_extract` tool refuses a pattern the model wrote. Stdlib only."""

from __future__ import annotations


def backtracks(pattern: str) -> str | None:
    """Why `pattern` can take exponential time in a backtracking engine, or None. Two shapes, found on the parsed
    pattern (so `[(]` or `\\(` don't count): an unbounded repeat around a body that one inner repeat can match
    alone (`(a+)+`, `(\\w+\\s?)*`: every split of a run is tried), and an unbounded repeat around alternatives of
    which two match the same text or a one-character one overlaps another's start (`(.|.)*`, `(x|.)*`). Heuristic, and the reward's
    time limit (`train.rl.reward_timeout`) guards what it misses."""
    import re

    parser = getattr(re, "_parser", None) or __import__("sre_parse")
    c = parser  # its opcodes
    ALL = None  # "any character"

    def first(items) -> set | None:
        """Characters an item sequence can start with (None: any); an empty set when it is unknown/empty."""
        for op, av in items:
            if op is c.LITERAL:
                return {av}
            if op is c.ANY:
                return ALL
            if op is c.IN:
                chars: set = set()
                for iop, iav in av:
                    if iop is c.LITERAL:
                        chars.add(iav)
                    elif iop is c.RANGE and iav[1] - iav[0] < 512:
                        chars.update(range(iav[0], iav[1] + 1))
                    else:  # categories (\\w, \\s, \\d), negation, wide ranges: treat as any
                        return ALL
                return chars
            if op is c.SUBPATTERN:
                return first(av[-1])
            if repeats(op):
                return first(av[2])
            if op is c.AT:
                continue
            return set()
        return set()

    def width_one(items) -> bool:
        lo, hi = items.getwidth() if hasattr(items, "getwidth") else (0, 0)
        return lo == hi == 1

    def overlaps(a, b) -> bool:
        return a is ALL and b != set() or b is ALL and a != set() or bool(a and b and a & b)

    def optional(op, av) -> bool:
        return op in (c.MAX_REPEAT, c.MIN_REPEAT) and av[0] == 0

    def repeats(op) -> bool:
        return op in (c.MAX_REPEAT, c.MIN_REPEAT)

    def body_items(items) -> list:
        out = list(items)
        while len(out) == 1 and out[0][0] is c.SUBPATTERN:
            out = list(out[0][1][-1])
        return out

    def check(items) -> str | None:
        for op, av in items:
            if repeats(op) and av[1] == c.MAXREPEAT:
                body = body_items(av[2])
                for k, (o, a) in enumerate(body):
                    if repeats(o) and a[1] > 1 and all(optional(*x) or x[0] is c.AT
                                                        for x in body[:k] + body[k + 1:]):
                        return "a repeat inside a repeat"
                for o, a in body:
                    if o is not c.BRANCH:
                        continue
                    alts = a[1]
                    for i in range(len(alts)):
                        for j in range(i + 1, len(alts)):
                            if list(alts[i]) == list(alts[j]) or (width_one(alts[i]) or width_one(alts[j])) \
                                    and overlaps(first(alts[i]), first(alts[j])):
                                return "alternatives under a repeat that match the same text"
            for sub in _children(op, av, c):
                why = check(sub)
                if why is not None:
                    return why
        return None

    return check(parser.parse(pattern))


def _children(op, av, c) -> list:
    if op is c.SUBPATTERN:
        return [av[-1]]
    if op in (c.MAX_REPEAT, c.MIN_REPEAT):
        return [av[2]]
    if op is c.BRANCH:
        return list(av[1])
    if op in (c.ASSERT, c.ASSERT_NOT):
        return [av[1]]
    if op is c.GROUPREF_EXISTS:
        return [x for x in av[1:] if x is not None]
    return []
