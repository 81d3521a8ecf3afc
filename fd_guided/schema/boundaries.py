"""Word boundaries (``\\b``) written out of a full-match regex tree (`regex.full_match_tree`).

A boundary holds between two characters when exactly one of them is a word character (Python's
``\\w`` set, exact: the ``wb`` node carries it), the string's start and end counting as non-word.
Neither engine has ``\\b``, but on a sequence ``L \\b R`` (L everything before it, R everything
after) it only splits the strings in two:

    L \\b R  =  (L ending in a word character)(R starting with a non-word one, or empty)
             ∪  (L ending in a non-word character, or empty)(R starting with a word one)

Each side is written from its item next to the boundary alone when that item cannot be empty
(``[a-z0-9]{1,6}\\b``: the item's strings that end in a word character, by a small automaton
intersection), or at once when the side is the search's ``.*`` (and parts that may be empty):
any string. That is what real patterns hold (the common URL pattern's ``\\.[a-z()]{1,6}\\b(...)*``,
``\\b(?:high|low)\\b``), and it stays small where a whole-pattern automaton would not (an
unanchored search over counted repetitions). Anything else (a boundary inside a group, next to
an item that may be empty, two in a row) goes to that whole-pattern automaton
(`languages.without_boundaries`), exact as well, or is refused past its bounds.
"""

from __future__ import annotations

from . import languages
from .refusal import Refusal
from .regex_parse import EMPTY_SET, EPSILON, complement, intersect, nodes, nullable

MAX_BOUNDARIES = 6  # written out next to their items: each splits the sequence in two
MAX_WRITTEN_OUT = 16  # in all (past MAX_BOUNDARIES, on the whole pattern's automaton)


class _NotLocal(Exception):
    """The sequence has a boundary the local rule does not cover."""


def without_boundaries(tree: tuple, any_char: tuple) -> tuple:
    """`tree` (a full-match tree over `any_char`) with its ``wb`` nodes written out: the same
    strings. EMPTY_SET when none is left; Refusal past the automata's bounds (its feature says
    which; `regex` names the boundaries around it)."""
    count = _count_boundaries(tree)
    if not count:
        return tree
    if count > MAX_WRITTEN_OUT:
        raise Refusal(f"more than {MAX_WRITTEN_OUT}")
    try:
        return _local(tree, any_char, [MAX_BOUNDARIES])
    except _NotLocal:
        return languages.without_boundaries(tree, any_char)


def _local(tree: tuple, any_char: tuple, budget: list[int]) -> tuple:
    if tree[0] == "alt":
        return _alt([_local(branch, any_char, budget) for branch in tree[1]])
    if tree[0] == "cat":
        return _sequence(list(tree[1]), any_char, budget)
    if tree[0] == "wb":
        return _sequence([tree], any_char, budget)
    if has_boundary(tree):
        raise _NotLocal
    return tree


def _sequence(items: list, any_char: tuple, budget: list[int]) -> tuple:
    where = next((i for i, item in enumerate(items) if item[0] == "wb"), None)
    if where is None:
        if any(has_boundary(item) for item in items):
            raise _NotLocal  # a boundary inside a group
        return ("cat", items)
    budget[0] -= 1
    if budget[0] < 0:
        raise _NotLocal
    word = items[where][1]
    left, right = items[:where], items[where + 1 :]
    if any(has_boundary(item) for item in left):
        raise _NotLocal
    left_word, left_other = _ends(left, word, any_char)
    right_word, right_other = _starts(right, word, any_char)
    branches = [
        _sequence(head + tail, any_char, budget)
        for head, tail in ((left_word, right_other), (left_other, right_word))
        if head is not None and tail is not None
    ]
    return _alt(branches)


def _ends(left: list, word: tuple, any_char: tuple) -> tuple[list | None, list | None]:
    """(L's strings ending in a word character, L's strings ending in another or empty) as
    item lists, None for none."""
    star = ("rep", 0, None, ("set", any_char))
    is_word, not_word = _classes(word, any_char)
    if not left:
        return None, []  # the string's start: not a word character
    if left[0] == star and all(nullable(item) for item in left[1:]):
        return [star, is_word], [("alt", [EPSILON, ("cat", [star, not_word])])]
    last = left[-1]
    if nullable(last):
        raise _NotLocal
    ending_word = languages.intersection(last, ("cat", [star, is_word]), any_char)
    ending_other = languages.intersection(last, ("cat", [star, not_word]), any_char)
    return (
        None if ending_word == EMPTY_SET else left[:-1] + [ending_word],
        None if ending_other == EMPTY_SET else left[:-1] + [ending_other],
    )


def _starts(right: list, word: tuple, any_char: tuple) -> tuple[list | None, list | None]:
    """(R's strings starting with a word character, R's strings starting with another or
    empty), as `_ends` does from the other end."""
    star = ("rep", 0, None, ("set", any_char))
    is_word, not_word = _classes(word, any_char)
    if not right:
        return None, []  # the string's end
    if right[-1] == star and all(nullable(item) for item in right[:-1]):
        return [is_word, star], [("alt", [EPSILON, ("cat", [not_word, star])])]
    first = right[0]
    if first[0] == "wb" or nullable(first) or has_boundary(first):
        raise _NotLocal
    starting_word = languages.intersection(first, ("cat", [is_word, star]), any_char)
    starting_other = languages.intersection(first, ("cat", [not_word, star]), any_char)
    return (
        None if starting_word == EMPTY_SET else [starting_word] + right[1:],
        None if starting_other == EMPTY_SET else [starting_other] + right[1:],
    )


def _classes(word: tuple, any_char: tuple) -> tuple[tuple, tuple]:
    return ("set", intersect(word, any_char)), ("set", intersect(complement(word), any_char))


def _alt(branches: list) -> tuple:
    branches = [branch for branch in branches if branch != EMPTY_SET]
    if not branches:
        return EMPTY_SET
    return branches[0] if len(branches) == 1 else ("alt", branches)


def _count_boundaries(tree: tuple) -> int:
    return sum(node[0] == "wb" for node in nodes(tree))


def has_boundary(tree: tuple) -> bool:
    """True when `tree` holds a ``\\b`` (a ``wb`` node) anywhere."""
    return any(node[0] == "wb" for node in nodes(tree))
