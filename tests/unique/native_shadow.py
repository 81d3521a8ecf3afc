"""A pytest plugin (``-p tests.unique.native_shadow``): every row the C loop decides is decided by
the Python reference too, from the same bits, and the two masks must be equal bit for bit.

Loaded by tests/unique/test_native.py in a subprocess running tests/unique/test_unique_guard.py, so the
adversarial guard tests double as differential tests of `fd_guided.unique.native`. At the end it
prints one JSON line: rows compared and mismatches.
"""
from __future__ import annotations

import json

import numpy as np

from fd_guided.unique import guard, native

STATS = {"rows": 0, "mismatches": 0, "undecided": 0}
_pending: dict[int, tuple] = {}
_plan = guard.UniqueItemsGrammar._native_plan
_restrict = native.restrict


def _shadow_plan(self, row):
    entry = _plan(self, row)
    if entry.__class__ is tuple:  # the C loop's row (else True: the reference's; False: unguarded)
        _pending[id(entry)] = (self, entry)
    return entry


def _shadow_restrict(table, words, entries):
    before = words.copy()
    left = _restrict(table, words, entries)
    for entry, undecided in zip(entries, left):
        grammar, _ = _pending.pop(id(entry))
        row = entry[0]
        actual = words[row].copy()
        grammar._decide(actual, undecided, False)
        expected = before[row].copy()
        grammar._restrict_words(expected)
        STATS["rows"] += 1
        STATS["undecided"] += len(undecided)
        if not np.array_equal(actual, expected):
            STATS["mismatches"] += 1
            raise AssertionError(f"native and reference masks differ after {bytes(grammar.tracker.buffer)[-60:]!r}: "
                                 f"words {np.nonzero(actual != expected)[0][:8]}")
    return left


def pytest_configure(config):
    assert native.AVAILABLE, "fd_guided.unique._native is not built"
    guard.UniqueItemsGrammar._native_plan = _shadow_plan
    native.restrict = _shadow_restrict


def pytest_unconfigure(config):
    print(json.dumps(STATS))
