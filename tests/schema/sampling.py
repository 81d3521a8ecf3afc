"""Random strings from a regex's language (through fd_guided.schema.regex's tree), for tests that
check that every string a pattern admits is accepted by an independent judge."""
from __future__ import annotations

import random

from fd_guided.schema import regex


def sample(pattern: str, rng: random.Random, *, count: int, max_repeat: int = 4, alphabet_bias: float = 0.7) -> list[str]:
    """`count` strings that fully match `pattern` (Python syntax), biased towards short ones."""
    tree, _ = regex.parse(pattern)
    tree = regex.full_match_tree(tree, (( 0x20, 0x7E),))
    return [_draw(tree, rng, max_repeat, alphabet_bias) for _ in range(count)]


def _draw(node, rng: random.Random, max_repeat: int, bias: float) -> str:
    kind = node[0]
    if kind == "set":
        ranges = node[1]
        ascii_part = regex.intersect(ranges, ((0x20, 0x7E),))
        pool = ascii_part if ascii_part and rng.random() < bias else ranges
        lo, hi = rng.choice(pool)
        return chr(rng.randint(lo, hi))
    if kind == "cat":
        return "".join(_draw(child, rng, max_repeat, bias) for child in node[1])
    if kind == "alt":
        return _draw(rng.choice(node[1]), rng, max_repeat, bias)
    if kind == "rep":
        lo, hi = node[1], node[2]
        top = lo + max_repeat if hi is None else min(hi, lo + max_repeat)
        return "".join(_draw(node[3], rng, max_repeat, bias) for _ in range(rng.randint(lo, top)))
    return ""
