"""Python's reading of a regex, as a small tree of code-point sets (`fd_guided.schema.regex`).

`parse` runs Python's own parser (`re._parser`) and converts its output into ``set``/``cat``/
``alt``/``rep`` nodes (plus ``bol``/``eol`` anchors and ``look`` look-aheads until
`regex.full_match_tree` resolves them); code-point sets are tuples of disjoint, sorted,
non-adjacent (lo, hi) ranges. Shorthands get Python's exact sets (found by `re` itself), except
that a positive ``\\d``/``\\w``/``\\s`` outside a negated class keeps its ASCII members (a subset).
Bounded (`MAX_NODES`); every failure is a `Refusal`.
"""

from __future__ import annotations

import functools
import re

# No stubs for these (Python 3.11's names for sre_constants/sre_parse, which now warn on import).
import re._constants as C  # type: ignore[import-not-found]
import re._parser as sre  # type: ignore[import-not-found]
from typing import Any

from .refusal import Refusal

MAX_CODE_POINT = 0x10FFFF
MAX_NODES = 20_000  # tree nodes after parsing; a pattern is at most a few KB in practice
ALL_CHARS = ((0, 0xD7FF), (0xE000, MAX_CODE_POINT))  # every code point but the surrogates
SPECIAL = ((0, 0x1F), (0x22, 0x22), (0x5C, 0x5C))  # control characters, '"' and '\\'

# ----- code-point sets: tuples of disjoint, sorted, non-adjacent (lo, hi) ranges ------------------


def normalise(ranges) -> tuple:
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def intersect(a, b) -> tuple:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


def complement(a) -> tuple:
    out, start = [], 0
    for lo, hi in a:
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CODE_POINT:
        out.append((start, MAX_CODE_POINT))
    return intersect(tuple(out), ALL_CHARS)


def contains(a, point: int) -> bool:
    return any(lo <= point <= hi for lo, hi in a)


@functools.cache
def _category(name: str, ascii_only: bool) -> tuple:
    """Python's exact set for ``\\d``/``\\w``/``\\s`` (found by `re` itself, in C, over every code point)."""
    flags = re.ASCII if ascii_only else 0
    text = _every_character()
    return normalise((m.start(), m.end() - 1) for m in re.finditer(f"\\{name}+", text, flags))


@functools.lru_cache(maxsize=1)
def _every_character() -> str:
    return "".join(map(chr, range(MAX_CODE_POINT + 1)))


_CATEGORIES = {
    C.CATEGORY_DIGIT: ("d", False),
    C.CATEGORY_NOT_DIGIT: ("d", True),
    C.CATEGORY_WORD: ("w", False),
    C.CATEGORY_NOT_WORD: ("w", True),
    C.CATEGORY_SPACE: ("s", False),
    C.CATEGORY_NOT_SPACE: ("s", True),
}


def _category_set(category, ascii_flag: bool, under: bool) -> tuple:
    """The set of a category; `under` allows a subset (positive shorthands become ASCII-only)."""
    name, negated = _CATEGORIES[category]
    if negated:
        return complement(_category(name, ascii_flag))
    return _category(name, True) if under else _category(name, ascii_flag)


# ----- parsing into a small tree ------------------------------------------------------------------
# ("set", ranges) | ("cat", [nodes]) | ("alt", [nodes]) | ("rep", lo, hi|None, node) | ("bol",) | ("eol",)
# | ("look", negative, node): a look-ahead, only until `full_match_tree` resolves it
# | ("wb", word): ``\b`` between a character of `word` (Python's ``\w`` set) and one outside it
#   (or an end), only until `full_match_tree` resolves it

EMPTY_SET: tuple = ("set", ())
EPSILON: tuple = ("cat", [])


def nodes(tree: tuple):
    """Every node of `tree`, iteratively (trees may be deep)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if node[0] in ("cat", "alt"):
            stack.extend(node[1])
        elif node[0] in ("rep",):
            stack.append(node[3])
        elif node[0] == "look":
            stack.append(node[2])


def nullable(node: tuple) -> bool:
    """True when `node` matches the empty string (anchors and look-aheads count as not)."""
    kind = node[0]
    if kind == "rep":
        return node[1] == 0 or nullable(node[3])
    if kind == "cat":
        return all(nullable(part) for part in node[1])
    if kind == "alt":
        return any(nullable(part) for part in node[1])
    return False


def parse(pattern: str) -> tuple[Any, int]:
    """Python's reading of `pattern` as a tree, and its global flags. Raises Refusal."""
    try:
        parsed = sre.parse(pattern)
    except (re.error, RecursionError, OverflowError, ValueError) as error:
        raise Refusal(
            f"pattern {pattern[:60]!r} that Python's re cannot read ({type(error).__name__}: {str(error)[:80]})"
        ) from None
    flags = parsed.state.flags
    if flags & (C.SRE_FLAG_IGNORECASE | C.SRE_FLAG_MULTILINE | C.SRE_FLAG_LOCALE):
        raise Refusal("regex flags (?i)/(?m) in a pattern")
    budget = [MAX_NODES]
    try:
        return _convert(parsed.data, flags, budget), flags
    except RecursionError:
        raise Refusal("a pattern nested too deeply") from None


def _convert(items, flags: int, budget: list[int]) -> tuple:
    nodes = [_convert_item(op, av, flags, budget) for op, av in items]
    return nodes[0] if len(nodes) == 1 else ("cat", nodes)


def _convert_item(op, av, flags: int, budget: list[int]) -> tuple:
    budget[0] -= 1
    if budget[0] < 0:
        raise Refusal("a pattern too large to analyse")
    if op is C.LITERAL:
        return ("set", ((av, av),))
    if op is C.NOT_LITERAL:
        return ("set", complement(((av, av),)))
    if op is C.ANY:
        return ("set", ALL_CHARS if flags & C.SRE_FLAG_DOTALL else complement(((10, 10),)))
    if op is C.IN:
        return ("set", _class_set(av, flags))
    if op is C.BRANCH:
        return ("alt", [_convert(branch, flags, budget) for branch in av[1]])
    if op is C.SUBPATTERN:
        group, add_flags, del_flags, body = av
        if add_flags & (C.SRE_FLAG_IGNORECASE | C.SRE_FLAG_MULTILINE):
            raise Refusal("regex flags (?i)/(?m) in a pattern")
        return _convert(body, (flags | add_flags) & ~del_flags, budget)
    if op in (C.MAX_REPEAT, C.MIN_REPEAT):  # laziness does not change which strings match
        lo, hi, body = av
        return ("rep", lo, None if hi is C.MAXREPEAT else hi, _convert(body, flags, budget))
    if op is C.AT:
        if av in (C.AT_BEGINNING, C.AT_BEGINNING_STRING):
            return ("bol",)
        if av in (C.AT_END, C.AT_END_STRING):
            return ("eol",)
        if av in (C.AT_BOUNDARY, C.AT_UNI_BOUNDARY):  # \b: resolved by `full_match_tree`
            return ("wb", _category("w", bool(flags & C.SRE_FLAG_ASCII)))  # what sre's \b tests
        raise Refusal(
            "\\B (not a word boundary) in a pattern"
            if av in (C.AT_NON_BOUNDARY, C.AT_UNI_NON_BOUNDARY)
            else "word boundaries (\\b, \\B) in a pattern"
        )
    if (
        op in (C.ASSERT, C.ASSERT_NOT) and av[0] == 1
    ):  # a look-ahead: resolved by `full_match_tree` at a pattern's start
        return ("look", op is C.ASSERT_NOT, _convert(av[1], flags, budget))
    feature = {
        C.ASSERT: "look-ahead/look-behind",
        C.ASSERT_NOT: "negative look-ahead/look-behind",
        C.GROUPREF: "back-references",
        C.GROUPREF_EXISTS: "conditional groups",
        C.ATOMIC_GROUP: "atomic groups",
        C.POSSESSIVE_REPEAT: "possessive repeats",
    }.get(op, str(op))
    raise Refusal(f"{feature} in a pattern")


def _class_set(items, flags: int) -> tuple:
    negated = bool(items) and items[0][0] is C.NEGATE
    ascii_flag = bool(flags & C.SRE_FLAG_ASCII)
    ranges: list[tuple[int, int]] = []
    for op, av in items[1:] if negated else items:
        if op is C.LITERAL:
            ranges.append((av, av))
        elif op is C.RANGE:
            ranges.append(av)
        elif op is C.CATEGORY:
            # Inside a negated class every member must be exact (the complement must not grow).
            ranges.extend(_category_set(av, ascii_flag, under=not negated))
        else:
            raise Refusal(f"class member {op} in a pattern")
    members = normalise(ranges)
    return complement(members) if negated else intersect(members, ALL_CHARS)
