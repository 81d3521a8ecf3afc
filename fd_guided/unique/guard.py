"""``uniqueItems`` over open item domains, enforced while the output is generated.

No grammar can say "these strings are all different", so neither engine enforces ``uniqueItems``
past small finite domains (which the normaliser enumerates). For a JSON-schema request whose
unique arrays hold *open* items (`fd_guided.schema.unique_items.open_domain`: strings without a
maximum length whose pattern or format never dead-ends, unbounded numbers, any value, objects
declaring no properties, unions of those with literals), the normaliser hands the engine the
array without ``uniqueItems`` and this guard adds it back around the engine's matcher:

  - `tracker.JsonTracker` follows the accepted bytes through the JSON structure: the
    instance path of every open container, and, inside each array `UniquePaths` says may need
    to be unique, the values of its finished items (by `jsonschema`'s equality: ``1`` equals
    ``1.0``, ``true`` is not ``1``, objects ignore key order; and by exact decimal value, so a
    long integer and its float spelling count as equal too);
  - `UniqueItemsGrammar.fill_bitmask` clears, after the engine filled the row, every allowed
    token that would finish an item equal to an earlier item of its array, or start a literal
    the array holds already. Only tokens that can do so in the current state are tried (those
    holding a quote, a number's end, a literal's first or last letter or a closing bracket:
    `TokenClasses`), each on a copy of the state (a string item is one set lookup);
  - `accept_token` refuses such a token too (the state stays as it was), so the guard holds for
    callers that accept without masking (speculative drafts).

Finite item domains too large to enumerate as arrays (`unique_items._guardable_finite`: an enum
of plain literals, e.g. 18 language codes, any number of them in any order) are guarded the same
way, and liveness is kept by `JsonTracker` itself: an item that could only become a value the
array holds already is refused at the token that makes it so (``"a1`` once ``a1``, ``a10`` and
``a11`` are used), and so is a comma once every value is used. There every allowed token is tried,
not only the token classes that can finish an item.

Object items that declare their properties and admit no others are guarded when their *last*
property (engines write properties in the schema's order) takes open values
(`unique_items._closing_guarded_objects`): once a member value ends and closing the object there
would repeat an earlier item, the tracker says so (`JsonTracker.closing`) and the guard asks the
engine itself whether a comma may follow (the token is accepted on the engine's matcher, one row
filled, and rolled back). Where only the ``}`` may follow, the token is refused: the last
property's value can still go on to a value no earlier item has. This costs a fill only on the
way to a repeat.

String items whose language can run out (a ``maxLength``, a pattern that ends such as
``^\\d+x$``; `unique_items._counted_strings`) are guarded with a count: the tracker walks the item's
characters through the language's automaton (`UniquePaths.item_strings`,
`languages.CountedLanguage`) and refuses a token after which the strings the item can still
become are all used, and a comma once every string (and ``null``, where allowed) is used. Only
the tokens that keep the item a prefix of a used string can do that, so only those are tried
beside the ones that finish an item (`JsonTracker.counted_candidates`).

Integer items (`UniquePaths.item_integers`: integers, not numbers) are open but for 0: an item
``0`` (or ``-0``) cannot go on, so one begun again when the array holds 0 is refused at once, as a
literal is (those tokens are tried besides the finishing ones).

Liveness: with open items some other item always remains (a string can go on, a number can take
more digits, an object another key, and a literal already held is never begun), and with a
finite domain no token is allowed that leaves the item without an unused value to become, so the
mask never becomes empty through this guard where the normaliser accepted the schema. An array guarded
without need (`UniquePaths` over-approximates) could dead-end on a closed item domain; the
manager then fails that request with "allows no token", never emits an invalid output.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..interface import Grammar
from ..kernels import allocate_pinned_bitmask
from ..schema.unique_paths import UniquePaths
from . import native
from .tracker import AFTER_QUOTE, CLASS_BYTES, LITERAL_START, QUOTE, JsonTracker


def needs_guard(spec) -> bool:
    """True for a JSON-schema request whose text mentions ``uniqueItems`` (cheap: `UniquePaths`
    decides per array; `spec.source` is the canonical compact schema text)."""
    return spec.kind == "json_schema" and "uniqueItems" in spec.source


class TokenClasses:
    """Per tokenizer: which tokens hold a byte of each class (built once, shared read-only)."""

    def __init__(self, token_bytes: Sequence[bytes | None]):
        texts = [text or b"" for text in token_bytes]
        lengths = np.fromiter((len(text) for text in texts), dtype=np.int64, count=len(texts))
        flat = np.frombuffer(b"".join(texts), dtype=np.uint8)
        byte_flags = np.zeros(256, dtype=np.uint8)
        for flag, members in CLASS_BYTES.items():
            byte_flags[list(members)] |= flag
        flags = np.zeros(len(texts), dtype=np.uint8)
        nonempty = lengths > 0
        if flat.size:
            starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))[nonempty]
            flags[nonempty] = np.bitwise_or.reduceat(byte_flags[flat], starts)
        literal_start = re.compile(rb"(?:^|[\s,\[])[tfn]")
        for token in np.nonzero(flags & LITERAL_START)[0].tolist():  # here: holds t, f or n
            if not literal_start.search(texts[token]):
                flags[token] &= 0xFF & ~LITERAL_START
        for token in np.nonzero(flags & QUOTE)[0].tolist():
            text = texts[token]
            if any(b in text[text.index(b'"') :] for b in b",]}"):
                flags[token] |= AFTER_QUOTE
        self.flags = flags
        self._texts = texts
        self._by_text: dict[bytes, list[int]] | None = None
        self.comma_ids = np.array(
            [i for i, text in enumerate(texts) if text.lstrip(b" \t\n\r").startswith(b",")], dtype=np.int64
        )
        self._ids: dict[int, np.ndarray] = {}
        self._vocab: Any = None

    def ids_of(self, texts: Sequence[bytes]) -> np.ndarray:
        """The ids of the tokens spelled exactly as one of `texts`."""
        if not texts:
            return np.zeros(0, dtype=np.int64)
        if self._by_text is None:
            self._by_text = {}
            for token, text in enumerate(self._texts):
                self._by_text.setdefault(text, []).append(token)
        return np.array(sorted({token for text in texts for token in self._by_text.get(text, ())}), dtype=np.int64)

    def native_vocab(self) -> Any:
        """The tokens as the C guard reads them (`native.vocab`: built once, ~20 ms)."""
        if self._vocab is None:
            self._vocab = native.vocab(self._texts, self.flags)
        return self._vocab

    @property
    def size(self) -> int:
        return len(self._texts)

    def ids(self, classes: int) -> np.ndarray:
        if classes not in self._ids:
            self._ids[classes] = np.nonzero(self.flags & classes)[0].astype(np.int64)
        return self._ids[classes]


_classes_by_tokenizer: dict[int, tuple[Any, TokenClasses]] = {}
_classes_lock = threading.Lock()


def token_classes(token_bytes: Sequence[bytes | None]) -> TokenClasses:
    """The shared `TokenClasses` of a token table (built on its first guarded request, ~20 ms)."""
    with _classes_lock:
        entry = _classes_by_tokenizer.get(id(token_bytes))
        if entry is None or entry[0] is not token_bytes:
            if len(_classes_by_tokenizer) >= 8:  # a server has one tokenizer; tests build a few
                _classes_by_tokenizer.pop(next(iter(_classes_by_tokenizer)))
            classes = TokenClasses(token_bytes)
            if native.AVAILABLE:
                # Made here, on the first guarded request's grammar, not in its first fill or accept.
                classes.native_vocab()
            entry = (token_bytes, classes)
            _classes_by_tokenizer[id(token_bytes)] = entry
        return entry[1]


class UniqueItemsGrammar(Grammar):
    """An engine matcher with ``uniqueItems`` enforced around it (module docstring).

    `matcher` is the engine's native matcher, so batched fills run natively; they then call
    `restrict_rows` for the rows of guarded grammars.
    """

    __slots__ = ("inner", "tracker", "token_bytes", "classes", "vocab_size", "_scratch", "matcher")

    def __init__(
        self, inner: Grammar, paths: UniquePaths, token_bytes: Sequence[bytes | None], vocab_size: int | None = None
    ):
        self.inner = inner
        self.tracker = JsonTracker(paths)
        self.token_bytes = token_bytes
        self.classes = token_classes(token_bytes)
        self.vocab_size = vocab_size if vocab_size is not None else len(token_bytes)
        self._scratch = None  # a one-row bitmask for `_comma_allowed`
        # `Grammar` has no `matcher`; the engines' grammars that batch their fills natively
        # (xgrammar's, llguidance's) set it once, and only their backends ask a guard for it
        # (twice a row per batched fill: a slot, not a property). Left unset otherwise.
        if hasattr(inner, "matcher"):
            self.matcher = inner.matcher

    def _bytes(self, token_id: int) -> bytes:
        return self.token_bytes[token_id] or b"" if 0 <= token_id < len(self.token_bytes) else b""

    def accept_token(self, token_id: int) -> bool:
        if not self.inner.accept_token(token_id):
            return False
        data = self._bytes(int(token_id))
        if native.ENABLED:
            # Plain bytes inside a string (most tokens): pushed and planned in C, the same state as
            # below; the Python path's footprint between two fills slowed the engine's next fill.
            pushed = native.push_plain(self.tracker, data)
            if pushed is not None:
                if not pushed:
                    self.inner.rollback(1)
                return pushed
        if not self.tracker.push(data):
            self.inner.rollback(1)
            return False
        if self.tracker.closing and not self._comma_allowed():
            self.tracker.rollback(1)
            self.inner.rollback(1)
            return False
        # The fill's plan for the new state, made now: a batched fill then reads one attribute
        # per row instead of walking the tracker's state (~1.5 us a row: as much as llguidance's
        # whole fill of a row inside a string).
        self.tracker.fill_plan = self._make_plan()
        return True

    def _comma_allowed(self) -> bool:
        """Does the engine, in its current state, allow another member (a comma) next? Where it
        does not, the object item must close now (its last property in the schema's order is
        written), and closing repeats an earlier item. Whitespace is optional in JSON, so if a
        comma may come after whitespace it may come at once: the token that is a bare comma
        (or any token starting with one) is enough to ask about."""
        if self._scratch is None:
            self._scratch = allocate_pinned_bitmask(1, self.vocab_size)
        self.inner.fill_bitmask(self._scratch, 0)
        words = host_words(self._scratch)[0].view(np.uint32)
        ids = self.classes.comma_ids
        ids = ids[ids < words.size * 32]
        return bool(_allowed(words, ids).any())

    def _closes_as_duplicate(self, token: int) -> bool:
        """After `token` (which the tracker found leaves an object item that closing repeats):
        would the engine force the close? Asked by accepting it on the engine and rolling back."""
        if not self.inner.accept_token(token):
            return False
        try:
            return not self._comma_allowed()
        finally:
            self.inner.rollback(1)

    def fill_bitmask(self, bitmask, row: int) -> None:
        self.inner.fill_bitmask(bitmask, row)
        self.restrict(bitmask, row)

    def restrict(self, bitmask, row: int) -> None:
        """Clear the bits of allowed tokens that would finish a duplicate item."""
        restrict_rows((self,), bitmask, (row,))

    def _plan(self) -> Any:
        """The fill plan of the tracker's state: made by `accept_token`, or now where the tracker
        moved since (`JsonTracker.fill_plan` is cleared whenever its state moves)."""
        plan = self.tracker.fill_plan
        if plan is None:
            plan = self.tracker.fill_plan = self._make_plan()
        return plan

    def _make_plan(self) -> Any:
        """False outside every guarded array; a `native` plan where the C side decides the row;
        True where the Python reference does (`_restrict_words`)."""
        return native.make_plan(self.tracker, self.classes.native_vocab)

    def _restrict_words(self, words: np.ndarray) -> None:
        """The Python reference: every candidate through `JsonTracker.finishes_duplicate`."""
        tracker = self.tracker
        finite = tracker.in_finite_domain()
        if finite:
            # Any token may lead into a dead end here (`"h` when "hex" is the one value left that
            # starts so and it is used): every allowed token is tried, each in full.
            bits = np.unpackbits(words.view(np.uint8), bitorder="little")[: len(self.token_bytes)]
            allowed = np.nonzero(bits)[0]
        else:
            ids = self.classes.ids(tracker.finishing_classes())  # token ids < vocab_size: inside the row
            extra = self.classes.ids_of(tracker.counted_candidates())
            if extra.size:
                ids = np.union1d(ids, extra[extra < words.size * 32])
            allowed = ids[_allowed(words, ids)]
        self._decide(words, allowed.tolist(), finite)

    def _decide(self, words: np.ndarray, tokens: Sequence[int], finite: bool) -> None:
        tracker, flags = self.tracker, self.classes.flags
        for token in tokens:
            goes_on = finite or bool(flags[token] & AFTER_QUOTE)
            if tracker.finishes_duplicate(self.token_bytes[token] or b"", goes_on) or (
                tracker.closing and self._closes_as_duplicate(token)
            ):
                words[token >> 5] &= np.uint32(~(1 << (token & 31)) & 0xFFFFFFFF)

    def is_terminated(self) -> bool:
        return self.inner.is_terminated()

    def rollback(self, num_tokens: int) -> None:
        self.inner.rollback(num_tokens)
        self.tracker.rollback(num_tokens)

    def reset(self) -> None:
        self.inner.reset()
        self.tracker.reset()

    def forced_bytes(self) -> bytes:
        # Forced bytes could finish a duplicate; inside guarded arrays nothing is forced.
        return b"" if self.tracker.guarded() else self.inner.forced_bytes()

    def canonical_forced_token(self) -> int | None:
        # The row is the engine's, then restricted: where the engine's fill allows one token,
        # ours allows at most that one (validate_tokens says whether the guard keeps it).
        return self.inner.canonical_forced_token()


def host_words(bitmask) -> np.ndarray:
    """The bitmask as a writable numpy int32 view (CPU memory, pinned or not); as the manager's."""
    return bitmask.numpy() if hasattr(bitmask, "numpy") else np.asarray(bitmask)


def _allowed(words: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Which of token `ids` (inside the row) bitmask row `words` (uint32) allows."""
    return ((words[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1).astype(bool)


def with_unique_guard(
    matcher: Grammar, spec, token_bytes: Sequence[bytes | None], vocab_size: int | None = None
) -> Grammar:
    """`matcher` guarded for ``uniqueItems`` when `spec` needs it (`needs_guard`), else itself.
    `vocab_size`: the width of the engine's bitmask rows (the logits width)."""
    if not needs_guard(spec):
        return matcher
    return UniqueItemsGrammar(matcher, _paths_for(spec.source), token_bytes, vocab_size)


@functools.lru_cache(maxsize=64)
def _paths_for(source: str) -> UniquePaths:
    """One (read-only, shareable) path plan per schema text."""
    return UniquePaths(json.loads(source))


def unguarded(grammar: Grammar) -> Grammar:
    """The engine's own matcher under a guard (the grammar itself when unguarded)."""
    return grammar.inner if isinstance(grammar, UniqueItemsGrammar) else grammar


def restrict_rows(grammars: Sequence[Grammar], bitmask, rows: Sequence[int]) -> None:
    """After a batched native fill: apply the guards of the guarded grammars among `grammars`.
    Every row planned for the C side (`native.make_plan`, at the token that led to it) is decided
    there in one call, the GIL released, with no Python per row; Python finishes the rest: rows
    whose plan is yet to be made (a rollback), rows the C side does not take, and the tokens it
    leaves undecided."""
    if not native.ENABLED:
        words = None
        for grammar, row in zip(grammars, rows):
            if grammar.__class__ is UniqueItemsGrammar and grammar._plan() is not False:
                words = host_words(bitmask).view(np.uint32) if words is None else words
                grammar._restrict_words(words[row])
        return
    left = native.restrict(_words_of, bitmask, grammars, rows, UniqueItemsGrammar)
    if not left:
        return
    words = _words_of(bitmask)
    again: list[int] = []
    for index, undecided in left:
        grammar = grammars[index]
        assert isinstance(grammar, UniqueItemsGrammar)  # `native.restrict` hands back guards only
        if undecided is not None:
            grammar._decide(words[rows[index]], undecided, grammar.tracker.in_finite_domain())
            continue
        fresh = grammar.tracker.fill_plan is None
        plan = grammar._plan()
        if plan is False:
            continue  # outside every guarded array (a first fill, before any token): nothing to restrict
        if fresh and native.is_plan(plan):
            again.append(index)  # planned just now (the tracker moved since its token): to C with the others
        else:
            grammar._restrict_words(words[rows[index]])
    if again:
        for index, undecided in native.restrict(
            _words_of, bitmask, [grammars[i] for i in again], [rows[i] for i in again], UniqueItemsGrammar
        ):
            grammar = grammars[again[index]]
            assert isinstance(grammar, UniqueItemsGrammar)
            row_words = words[rows[again[index]]]
            if undecided is None:
                grammar._restrict_words(row_words)
            else:
                grammar._decide(row_words, undecided, grammar.tracker.in_finite_domain())


def _words_of(bitmask) -> np.ndarray:
    return host_words(bitmask).view(np.uint32)
