"""Regexes read exactly as Python's `re` reads them, re-printed for an engine that enforces them.

JSON Schema's ``pattern`` is judged with Python's ``re.search`` (that is what `jsonschema` runs), so
Python's parser (`re._parser`) is the one authority: a pattern is parsed once into a small tree of
code-point sets, sequences, alternations and counted repetitions (`regex_parse`), its anchors and
a leading look-ahead resolved into one full-match tree (`regex_reading.full_match_tree`,
`languages.combine`), then printed in the syntax of the target engine as a **full-match** regex
whose language is a subset of the strings Python's ``re.search`` accepts. Nothing here calls a
native engine: the analysis is pure Python, bounded by the pattern's size, and every failure
(parse error, hostile nesting) is a `Refusal`.

Exact except where it is deliberately smaller (sound: it only ever drops strings):
  - a positive ``\\d``/``\\w``/``\\s`` outside a negated class keeps its ASCII members (Python's are
    Unicode-wide); every negated form (``\\D``, ``[^\\w]``, ...) is Python's exact set;
  - a final ``$`` does not admit Python's optional trailing newline;
  - xgrammar: its JSON-string regexes emit ``"``, ``\\`` and control characters raw (invalid JSON, or
    another string), so those characters are removed from every set; a pattern that then matches
    nothing is refused;
  - llguidance: a class that holds a control character but not both ``"`` and ``\\`` admits the
    escapes ``\\"`` and ``\\\\`` as well (measured), so such classes lose their control characters.
A look-ahead inside the pattern's top-level sequence (``X(?=Y)Z``, ``X(?!Y)Z``) constrains the
rest of the string at its position: written out on automata (`regex_reading`); one that ends a
pattern without ``$`` (``X(?=Y)``) is the plain suffix ``XY`` (a search match may run on past
it). Word boundaries (``\\b``) are written out on an automaton that remembers whether the
previous character was a word character (Python's ``\\w`` set, exact; `boundaries`).
Refused: look-behind, a look-ahead nested in a group or beside a ``\\b``, back-references,
``\\B``, conditionals, atomic groups, possessive repeats, the IGNORECASE and MULTILINE flags,
anchors inside the pattern (those Python's parser moved into a factored group are lifted back),
and (xgrammar) counted repetitions above 128 (they fail its compile cache check,
``per_rule_fsm_hashes``).
Optional parts are printed as ``{0,1}``: xgrammar's JSON-schema path drops the first element of a
``(...)?`` group that holds a repetition (``^a(b[0-9]{1,6})?$`` admitted ``"a12"``).
"""

from __future__ import annotations

import functools
import re

from . import languages
from .refusal import Refusal, Unsatisfiable
from .regex_parse import (
    ALL_CHARS,
    EMPTY_SET,
    EPSILON,
    SPECIAL,
    complement,
    contains,
    intersect,
    normalise,
    nullable,
    parse,
)
from .regex_reading import full_match_reading, full_match_tree

XGRAMMAR_MAX_COUNT = 128
MAX_REPEAT_PRODUCT = 1 << 16  # nested counted repetitions, multiplied out
_ALL = ALL_CHARS
_SPECIAL = SPECIAL

# ----- engine restrictions and simplification ------------------------------------------------------


def restrict(node: tuple, allowed: tuple, llguidance_classes: bool = False) -> tuple:
    """`node` with every set intersected with `allowed`; dead parts removed (EMPTY_SET if none left)."""
    kind = node[0]
    if kind == "set":
        members = intersect(node[1], allowed)
        is_class = len(members) > 1 or (len(members) == 1 and members[0][0] != members[0][1])
        if llguidance_classes and is_class:
            if intersect(members, ((0, 0x1F),)) and not (contains(members, 0x22) and contains(members, 0x5C)):
                members = intersect(members, complement(((0, 0x1F),)))
        return ("set", members)
    if kind == "cat":
        parts = [restrict(child, allowed, llguidance_classes) for child in node[1]]
        if any(part == EMPTY_SET for part in parts):
            return EMPTY_SET
        flat: list = []
        for part in parts:
            flat.extend(part[1] if part[0] == "cat" else [part])
        return flat[0] if len(flat) == 1 else ("cat", flat)
    if kind == "alt":
        branches = [b for b in (restrict(child, allowed, llguidance_classes) for child in node[1]) if b != EMPTY_SET]
        if not branches:
            return EMPTY_SET
        non_empty = [b for b in branches if b != EPSILON]
        if len(non_empty) < len(branches):  # an empty alternative: make the rest optional
            return ("rep", 0, 1, non_empty[0] if len(non_empty) == 1 else ("alt", non_empty)) if non_empty else EPSILON
        return branches[0] if len(branches) == 1 else ("alt", branches)
    if kind == "rep":
        body = restrict(node[3], allowed, llguidance_classes)
        if body == EMPTY_SET or body == EPSILON:
            return EPSILON if node[1] == 0 or body == EPSILON else EMPTY_SET
        if node[2] == 0:
            return EPSILON
        return ("rep", node[1], node[2], body)
    return node


def check_counts(node: tuple, max_count: int | None) -> None:
    """Refuse counted repetitions above `max_count` and nested counts multiplying past the budget."""
    stack = [(node, 1)]
    while stack:
        node, product = stack.pop()
        if node[0] in ("cat", "alt"):
            stack.extend((child, product) for child in node[1])
        elif node[0] == "rep":
            lo, hi = node[1], node[2]
            count = max(lo, hi or 0)
            if max_count is not None and count > max_count:
                raise Refusal(f"a counted repetition above {max_count} in a pattern")
            product *= max(count, 1)
            if product > MAX_REPEAT_PRODUCT:
                raise Refusal("nested counted repetitions too large in a pattern")
            stack.append((node[3], product))


# ----- printing ------------------------------------------------------------------------------------

_XG_META = set("\\^$.|?*+()[]{}-/")


def _xg_char(point: int, in_class: bool) -> str:
    char = chr(point)
    if char.isascii() and (char.isalnum() or char == " " or char == "_"):
        return char
    if 0x21 <= point <= 0x7E:
        # Only metacharacters are escaped: xgrammar warns on (and ignores) a needless escape like "\,".
        return "\\" + char if char in _XG_META else char
    if point > 0xFFFF:
        return char  # xgrammar reads astral characters literally; it has no \U escape
    return f"\\u{point:04x}"


def _ll_char(point: int, in_class: bool) -> str:
    char = chr(point)
    if char.isascii() and (char.isalnum() or char == "_"):
        return char
    return f"\\x{{{point:x}}}"


def to_text(node: tuple, dialect: str) -> str:
    char = _xg_char if dialect == "xgrammar" else _ll_char
    return _print(node, char)


def _print(node: tuple, char) -> str:
    kind = node[0]
    if kind == "set":
        ranges = node[1]
        if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
            return char(ranges[0][0], False)
        body = "".join(char(lo, True) if lo == hi else f"{char(lo, True)}-{char(hi, True)}" for lo, hi in ranges)
        return f"[{body}]"
    if kind == "cat":
        return "".join(_group(child, char) if child[0] == "alt" else _print(child, char) for child in node[1])
    if kind == "alt":
        return "|".join(_print(child, char) for child in node[1])
    if kind == "rep":
        lo, hi, body = node[1], node[2], node[3]
        text = _print(body, char) if _is_atom(body) else _group(body, char)
        if hi is None:
            return text + ("*" if lo == 0 else "+" if lo == 1 else f"{{{lo},}}")
        return text + (f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}")
    raise ValueError(f"cannot print {kind}")


def _is_atom(node: tuple) -> bool:
    return node[0] == "set"


def _group(node: tuple, char) -> str:
    return f"({_print(node, char)})"


# ----- the entry points ----------------------------------------------------------------------------

PLAIN_JSON_CHARS = intersect(complement(normalise(_SPECIAL)), _ALL)


@functools.lru_cache(maxsize=4096)
def translate(pattern: str, engine: str) -> str:
    """`pattern` (JSON Schema ``pattern``: Python ``re.search``) as an anchored full-match regex for
    `engine` (``"xgrammar"`` or ``"llguidance"``), never admitting a string Python rejects.

    Raises Refusal naming the construct that cannot be carried over.
    """
    tree, _ = parse(pattern)
    return print_full_match(full_match_tree(tree, PLAIN_JSON_CHARS if engine == "xgrammar" else _ALL), engine, pattern)


def print_full_match(tree: tuple, engine: str, pattern: str = "") -> str:
    """A full-match tree (`full_match_tree`, over the engine's characters) as `engine`'s anchored
    regex text. Raises Refusal where the engine cannot match it as written."""
    if engine == "xgrammar":
        tree = restrict(tree, PLAIN_JSON_CHARS)
        if tree == EMPTY_SET:
            raise Refusal(f"pattern {pattern[:60]!r} (xgrammar can only match it with escaped characters)")
        check_counts(tree, XGRAMMAR_MAX_COUNT)
        text = to_text(tree, "xgrammar")
        return f"^({text})$" if tree[0] == "alt" else f"^{text}$"  # a look-ahead's difference can be an alternation
    tree = restrict(tree, _ALL, llguidance_classes=True)
    if tree == EMPTY_SET:
        raise Refusal(f"pattern {pattern[:60]!r} (llguidance could only match it through classes it mis-escapes)")
    check_counts(tree, None)
    return f"^({to_text(tree, 'llguidance')})$"


@functools.lru_cache(maxsize=1024)
def translate_full_match(pattern: str, engine: str) -> str:
    """A whole-output regex (``guided_regex``, judged by Python's ``re.fullmatch``) for `engine`,
    never admitting a string Python rejects; ``^``/``$`` at its ends are no-ops, anywhere else refused.

    Raises Refusal for a construct that cannot be carried over, and Unsatisfiable when Python's
    reading matches no string at all (``[^\\s\\S]``): the engines' own negated classes can
    admit surrogate-adjacent bytes there (llguidance generated U+E000 for it).
    """
    tree = restrict(full_match_reading(pattern), _ALL)
    if tree == EMPTY_SET:
        raise Unsatisfiable(f"the regex {pattern[:60]!r} matches no string")
    check_counts(tree, XGRAMMAR_MAX_COUNT if engine == "xgrammar" else None)
    return to_text(tree, engine) if tree != EPSILON else ""


def extendable(pattern: str, *, full_match: bool = False) -> bool:
    """True when every prefix of a string `pattern` accepts (``re.search``, or ``re.fullmatch``
    with `full_match`) extends to infinitely many accepted strings of printable characters: the
    language never ends in a dead end (`fd_guided.schema.unique_items`). First a cheap sufficient
    check on the tree (the pattern is unanchored at its end, or every way through it ends in an
    unbounded repetition), then the exact one on its automaton (`languages.extendable`: ``^(a|b+)$``
    is not, ``^/?([^/]+/)*[^/]+/?$`` is). False when unsure (past the automaton's bounds)."""
    try:
        tree = full_match_reading(pattern) if full_match else full_match_tree(parse(pattern)[0], _ALL)
    except Refusal:
        return False
    return _ends_open(tree) or languages.extendable(tree, PLAIN_JSON_CHARS)


def _ends_open(node: tuple) -> bool:
    kind = node[0]
    if kind == "rep":
        return (node[2] is None and _has_printable(node[3])) or _ends_open(node[3])
    if kind == "alt":
        return bool(node[1]) and all(_ends_open(branch) for branch in node[1])
    if kind == "cat":
        return (
            bool(node[1])
            and _ends_open(node[1][-1])
            and all(_has_printable(part) or nullable(part) for part in node[1])
        )
    return False


def _has_printable(node: tuple) -> bool:
    """Some string of `node` holds a character every engine keeps in a JSON string (not '"', '\\' or a control)."""
    kind = node[0]
    if kind == "set":
        return bool(intersect(node[1], complement(_SPECIAL)))
    if kind == "rep":
        return (node[2] is None or node[2] > 0) and _has_printable(node[3])
    if kind in ("alt", "cat"):
        return any(_has_printable(part) for part in node[1])
    return False


def python_compiles(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError, ValueError):
        return False
    return True


@functools.lru_cache(maxsize=256)
def string_language(patterns: tuple, full_patterns: tuple, low: int, high: int | None):
    """The strings a string schema admits as a `languages.CountedLanguage`: every pattern of
    `patterns` (``re.search``) and `full_patterns` (full matches: formats) and a length in
    [`low`, `high`] code points; None when it cannot be built within bounds."""
    try:
        trees = [("rep", low, high, ("set", _ALL))]
        trees += [full_match_tree(parse(pattern)[0], _ALL) for pattern in patterns]
        trees += [full_match_reading(pattern) for pattern in full_patterns]
        return languages.CountedLanguage(trees, PLAIN_JSON_CHARS)
    except (Refusal, RecursionError):
        return None
