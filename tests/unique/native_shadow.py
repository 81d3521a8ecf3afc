"""A pytest plugin (``-p tests.unique.native_shadow``): every row the C side decides is decided by
the Python reference too, from the same bits, and the two masks must be equal bit for bit.

Loaded by tests/unique/test_native.py in a subprocess running tests/unique/test_unique_guard.py, so the
adversarial guard tests double as differential tests of `fd_guided.unique.native`. At the end it
prints one JSON line: rows compared, mismatches, and the tokens the C side left to Python.
"""
from __future__ import annotations

import json

from fd_guided.unique import guard, native

STATS = {"rows": 0, "mismatches": 0, "undecided": 0, "states": {}}
_restrict = native.restrict


def _shadow_restrict(words_of, bitmask, grammars, rows, guard_type):
    words = words_of(bitmask)
    planned = [(index, grammar, rows[index]) for index, grammar in enumerate(grammars)
               if grammar.__class__ is guard_type and native.is_plan(grammar.tracker.fill_plan)]
    before = {index: words[row].copy() for index, _, row in planned}
    left = _restrict(words_of, bitmask, grammars, rows, guard_type)
    undecided = dict(left)
    for index, grammar, row in planned:
        if index in undecided and undecided[index] is None:
            continue  # a stale plan (or no memory): Python decides the whole row
        actual = words[row].copy()
        grammar._decide(actual, undecided.get(index) or [], grammar.tracker.in_finite_domain())
        expected = before[index].copy()
        grammar._restrict_words(expected)
        state = f"{grammar.tracker.stack[-1][0]}{grammar.tracker.mode}"  # the top frame and the scalar mode
        STATS["states"][state] = STATS["states"].get(state, 0) + 1
        STATS["rows"] += 1
        STATS["undecided"] += len(undecided.get(index) or [])
        if (actual != expected).any():
            STATS["mismatches"] += 1
            raise AssertionError(f"native and reference masks differ after {bytes(grammar.tracker.buffer)[-60:]!r}")
    return left


def pytest_configure(config):
    assert native.AVAILABLE, "fd_guided.unique._native is not built"
    native.restrict = _shadow_restrict
    assert guard.native is native


def pytest_unconfigure(config):
    print(json.dumps(STATS))
