"""A pattern's reading as one full-match tree: what ``re.search`` (`full_match_tree`) or
``re.fullmatch`` (`full_match_reading`) of it accepts, as a tree of sets, sequences,
alternations and counted repetitions with no anchor, look-ahead or word boundary left in it.

Anchors Python's parser moved into a factored group are lifted back to the ends (`_lift_anchors`);
a leading look-ahead intersects the rest (`languages.combine`); a look-ahead inside the top-level
sequence (``X(?=Y)Z``, ``X(?!Y)Z``) constrains the rest of the string at its position and is
written out on automata (`_inner_looks`); one that ends a pattern without ``$`` (``X(?=Y)``) is the
plain suffix ``XY``; word boundaries are written out (`boundaries`). Anything else (an anchor or
look-ahead inside a group, a look-ahead beside a ``\\b``) is a `Refusal`. Printing for an engine
is `regex`'s.
"""

from __future__ import annotations

from . import boundaries, languages
from .refusal import Refusal
from .regex_parse import ALL_CHARS, nullable, parse

MAX_INNER_LOOKS = 8  # look-aheads inside a sequence: an automaton each (leading ones share one pass)


def full_match_tree(tree: tuple, any_char: tuple) -> tuple:
    """A tree whose full matches are strings that ``re.search`` of `tree` accepts (anchors resolved)."""
    if tree[0] == "alt":
        return ("alt", [full_match_tree(branch, any_char) for branch in tree[1]])
    items = _spliced(list(tree[1]) if tree[0] == "cat" else [tree])
    if len(items) == 1 and items[0][0] in ("alt", "cat"):
        return full_match_tree(items[0], any_char)
    if (
        items
        and items[-1][0] == "alt"
        and any(_ends_with(branch, "eol") for branch in items[-1][1])
        and not all(_ends_with(branch, "eol") for branch in items[-1][1])
    ):
        # ``^(?:a|b$)``, Python's reading of ``^a|^b$``: as the alternation it was written as
        return full_match_tree(
            (
                "alt",
                [
                    ("cat", items[:-1] + (list(branch[1]) if branch[0] == "cat" else [branch]))
                    for branch in items[-1][1]
                ],
            ),
            any_char,
        )
    items = _lift_anchors(items)
    anchored_start = bool(items) and items[0][0] == "bol"
    anchored_end = bool(items) and items[-1][0] == "eol" and len(items) > (1 if anchored_start else 0)
    if anchored_start:
        items = items[1:]
    if anchored_end:
        items = items[:-1]
    while items and items[0][0] == "bol" and anchored_start:  # "^^a"
        items = items[1:]
    # Beside the search's ``.*`` an item that may match nothing adds nothing (``A N .*`` is
    # ``A .*``), whatever it holds: ``^/(([a-z]+/)*[a-z]+$)?`` is ``^/`` and then anything.
    while not anchored_end and items and nullable(items[-1]):
        items = items[:-1]
    while not anchored_start and items and nullable(items[0]):
        items = items[1:]
    looks = []
    while anchored_start and items and items[0][0] == "look":
        looks.append(items.pop(0))
    if not anchored_end and items and items[-1][0] == "look" and not items[-1][1]:
        # ``X(?=Y)`` with nothing after it: a search match may run on past the look-ahead, so
        # ``X(?=Y).*`` is ``XY.*`` (catalogue entries' ``(?:[^/]*/)*(?=\.(yaml|json))``).
        items = items[:-1] + [items[-1][2]]
    star = ("rep", 0, None, ("set", any_char))
    tail = [] if anchored_end else [star]
    items, tail = _inner_looks(items, tail, any_char)
    _no_inner_anchor(("cat", items))
    tree = _without_boundaries(("cat", ([] if anchored_start else [star]) + items + tail), any_char)
    for _, negative, body in looks:
        tree = languages.combine(
            tree, _without_boundaries(_prefix_language(body, any_char), any_char), negative, any_char
        )
    return tree


def _inner_looks(items: list, tail: list, any_char: tuple) -> tuple[list, list]:
    """`items` with each look-ahead of the sequence written out, rightmost first: everything
    after a look-ahead, to the string's end (`tail`: the search's ``.*``, or nothing before
    ``$``), is the string's rest at that position, so ``X(?=Y)Z`` is ``X`` then the rests of
    ``Z`` that begin (or, ``(?!Y)``, do not begin) with a match of ``Y`` (`languages.combine`,
    exact). A look-ahead beside a word boundary is refused (the rest would lose the character
    before it)."""
    looks = sum(item[0] == "look" for item in items)
    if looks > MAX_INNER_LOOKS:
        raise Refusal(f"more than {MAX_INNER_LOOKS} look-aheads in a pattern")
    if looks and boundaries.has_boundary(("cat", items)):  # look-ahead bodies included
        raise Refusal("a look-ahead beside a word boundary (\\b) in a pattern")
    for index in reversed(range(len(items))):
        if items[index][0] != "look":
            continue
        _, negative, body = items[index]
        rest = ("cat", items[index + 1 :] + tail)
        _no_inner_anchor(rest)
        items, tail = (
            items[:index] + [languages.combine(rest, _prefix_language(body, any_char), negative, any_char)],
            [],
        )
    return items, tail


def _without_boundaries(tree: tuple, any_char: tuple) -> tuple:
    """A full-match tree with its ``\\b`` nodes written out (`boundaries`): the whole string is
    in the tree by now, so the characters around each boundary are known."""
    try:
        return boundaries.without_boundaries(tree, any_char)
    except Refusal as refusal:
        raise Refusal(f"word boundaries (\\b) in a pattern ({refusal.feature})") from None


def _spliced(items: list) -> list:
    """A sequence with the sequences nested in it (a group's content) spliced in: concatenation is
    associative, and ``^(a$)|(^b$)`` then shows its anchors at the ends of each branch."""
    out = []
    for item in items:
        out.extend(_spliced(list(item[1])) if item[0] == "cat" else [item])
    return out


def _lift_anchors(items: list) -> list:
    """Anchors Python's parser moved inside a group, lifted back to the ends where they act: it
    factors a common prefix out of alternatives, so ``^a$|^b$`` reads as ``^(?:a$|b$)``; a ``$``
    ending every branch of a final group is the pattern's ``$``, and a ``^`` opening every
    branch of the first group right after ``^`` is a no-op (``^(?:^x)?``)."""
    if items and items[-1][0] == "alt" and items[-1][1] and all(_ends_with(branch, "eol") for branch in items[-1][1]):
        items = items[:-1] + [("alt", [_strip_edge(branch, "eol") for branch in items[-1][1]]), ("eol",)]
    if len(items) > 1 and items[0][0] == "bol":
        first = items[1]
        if first[0] == "alt" and first[1] and all(_ends_with(branch, "bol", start=True) for branch in first[1]):
            items = [items[0], ("alt", [_strip_edge(branch, "bol", start=True) for branch in first[1]])] + items[2:]
        elif first[0] == "rep" and first[2] == 1 and _ends_with(first[3], "bol", start=True):
            items = [items[0], ("rep", first[1], 1, _strip_edge(first[3], "bol", start=True))] + items[2:]
    return items


def _ends_with(node: tuple, kind: str, start: bool = False) -> bool:
    items = list(node[1]) if node[0] == "cat" else [node]
    return bool(items) and items[0 if start else -1][0] == kind


def _strip_edge(node: tuple, kind: str, start: bool = False) -> tuple:
    items = list(node[1]) if node[0] == "cat" else [node]
    items = items[1:] if start else items[:-1]
    return items[0] if len(items) == 1 else ("cat", items)


def _prefix_language(body: tuple, any_char: tuple) -> tuple:
    """The strings that begin with a match of look-ahead `body` at position 0: ``body.*``, where a
    branch ending in ``$`` must reach the end (or a final newline, as Python's ``$`` does: exact
    for a negative look-ahead, whose complement must not grow)."""
    branches = body[1] if body[0] == "alt" else [body]
    out = []
    for branch in branches:
        items = list(branch[1]) if branch[0] == "cat" else [branch]
        if items and items[-1][0] == "eol":
            items = items[:-1] + [("rep", 0, 1, ("set", ((10, 10),)))]
        else:
            items = items + [("rep", 0, None, ("set", any_char))]
        _no_inner_anchor(("cat", items))
        out.append(("cat", items))
    return out[0] if len(out) == 1 else ("alt", out)


def _no_inner_anchor(node: tuple) -> None:
    stack = [node]
    while stack:
        node = stack.pop()
        if node[0] in ("bol", "eol"):
            raise Refusal("anchors (^, $) inside a pattern rather than at its ends")
        if node[0] == "look":
            raise Refusal(f"{'negative ' if node[1] else ''}look-ahead inside a group or repetition of a pattern")
        if node[0] in ("cat", "alt"):
            stack.extend(node[1])
        elif node[0] == "rep":
            stack.append(node[3])


def full_match_reading(pattern: str) -> tuple:
    """`pattern` read for ``re.fullmatch``: ``^``/``$`` at the ends of each branch dropped (no-ops
    there), anywhere else refused."""
    tree, _ = parse(pattern)
    branches = tree[1] if tree[0] == "alt" else [tree]
    tree = (
        ("alt", [_strip_end_anchors(branch) for branch in branches])
        if len(branches) > 1
        else _strip_end_anchors(branches[0])
    )
    _no_inner_anchor(tree)
    return _without_boundaries(tree, ALL_CHARS)


def _strip_end_anchors(node: tuple) -> tuple:
    items = list(node[1]) if node[0] == "cat" else [node]
    while items and items[0][0] == "bol":
        items = items[1:]
    while items and items[-1][0] == "eol":
        items = items[:-1]
    return items[0] if len(items) == 1 else ("cat", items)
