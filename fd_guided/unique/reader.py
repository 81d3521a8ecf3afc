"""The byte-level JSON reader under the ``uniqueItems`` guard's tracker (`tracker.JsonTracker`).

`JsonReader` follows the bytes of JSON an engine already admitted (it checks no syntax; the grammar
does): the open containers as immutable frames (``("o", nodes, key, phase)``, ``("a", nodes,
index, phase, unique)``, `UniquePaths` node sets), the scalar being written, and in each array that
may need unique items its finished items (`items.Unique`, keyed by `item_keys`) and where the
current one began. `feed` consumes bytes and says False as soon as an item equal to an earlier
one of its array finishes (or, in a finite domain, when the item can only become a used value).
Snapshots, rollback and the guard's questions are the tracker's (tracker.py).
"""

from __future__ import annotations

import json

from ..schema.leaves import json_key
from ..schema.unique_paths import NodeSet, UniquePaths
from .items import Unique, item_keys, never_runs_out, sorted_texts

_WS = b" \t\n\r"
_NUMBER_BYTES = frozenset(b"0123456789+-.eE")
_LITERAL_LENGTH = {ord("t"): 4, ord("f"): 5, ord("n"): 4}
# A literal item is decided by its first byte: starting one that its array holds already is a
# dead end (``true`` cannot go on into another value), so it counts as a duplicate at once.
_LITERAL_KEY = {ord("t"): json_key(True), ord("f"): json_key(False), ord("n"): json_key(None)}
# The scalar being written
_NONE, _STRING, _NUMBER, _LITERAL = 0, 1, 2, 3


class JsonReader:
    """The JSON structure of the bytes fed so far (module docstring); the bytes live once in `buffer`."""

    def __init__(self, paths: UniquePaths):
        self.paths = paths
        self.buffer = bytearray()
        self.stack: tuple = ()
        self.mode = _NONE
        self.escape = 0  # in a string: 1 after a backslash, 2..5 inside \\uXXXX
        self.is_key = False
        self.start = 0  # where the current scalar began
        self.duplicate = False
        # Set by the last `feed` when it ended a member value of an object item of a guarded array,
        # and closing that object now would repeat an earlier item: the guard then asks the engine
        # whether anything but the close may follow (`guard.UniqueItemsGrammar`).
        self.closing = False

    def _top_unique(self) -> Unique | None:
        """The items of the innermost container when it is a guarded array."""
        return _unique_of(self.stack[-1]) if self.stack else None

    def feed(self, data: bytes) -> bool:
        """Consume `data`; False as soon as an item equal to an earlier one of its array finished."""
        self.closing = False
        at, end = 0, len(data)
        while at < end:
            if self.mode == _STRING and not self.escape:
                plain = _string_run_end(data, at)  # bytes that only extend the string
                if plain > at:
                    self.buffer += data[at:plain]
                    at = plain
                    if not self._item_live():
                        return False
                    continue
            byte = data[at]
            self.buffer.append(byte)
            self._byte(byte)
            at += 1
            if self.duplicate or not self._item_live():
                return False
        return True

    def _item_live(self) -> bool:
        """False when the item being written in a finite-domain guarded array can no longer end as
        a value the array does not hold yet (every way on is a duplicate: a dead end)."""
        unique = self._top_unique()
        if unique is None or unique.start < 0 or self.mode == _NONE:
            return True
        if (
            unique.unused is None
            and (unique.language is None or never_runs_out(unique.language))
            and not (unique.integers and self.mode == _NUMBER)
        ):
            return True  # (`Unique.live` is then true: no copy of the item's bytes)
        return unique.live(bytes(self.buffer[unique.start :]))

    def _byte(self, byte: int) -> None:
        mode = self.mode
        if mode == _STRING:
            self._string_byte(byte)
            return
        if mode == _NUMBER:
            if byte in _NUMBER_BYTES:
                return
            self.mode = _NONE
            self._value_end(len(self.buffer) - 1)
        elif mode == _LITERAL:
            if len(self.buffer) - self.start == _LITERAL_LENGTH.get(self.buffer[self.start], 4):
                self.mode = _NONE
                self._value_end(len(self.buffer))
            return
        self._structural(byte)

    def _string_byte(self, byte: int) -> None:
        if self.escape == 1:
            self.escape = 2 if byte == ord("u") else 0
        elif self.escape:
            self.escape = 0 if self.escape == 5 else self.escape + 1
        elif byte == ord("\\"):
            self.escape = 1
        elif byte == ord('"'):
            self.mode = _NONE
            end = len(self.buffer)
            if self.is_key:
                self._key_end(end)
            else:
                self._value_end(end)

    def _structural(self, byte: int) -> None:
        at = len(self.buffer) - 1
        if byte in _WS:
            return
        self.closing = False  # something other than the close comes next (or the close itself, checked as an item end)
        if byte == ord('"'):
            self.is_key = bool(self.stack) and self.stack[-1][0] == "o" and self.stack[-1][3] == "key"
            if not self.is_key:
                self._value_start(at)
            self.mode, self.start, self.escape = _STRING, at, 0
        elif byte == ord("-") or ord("0") <= byte <= ord("9"):
            self._value_start(at)
            self.mode, self.start = _NUMBER, at
        elif byte in _LITERAL_LENGTH:
            self._value_start(at)
            self.mode, self.start = _LITERAL, at
            unique = self._top_unique()
            if unique is not None and unique.holds(_LITERAL_KEY[byte]):
                self.duplicate = True
        elif byte == ord("{") or byte == ord("["):
            self._value_start(at)
            nodes = self._child_nodes()
            if byte == ord("{"):
                self.stack += (("o", nodes, None, "key"),)
            else:
                unique = self._unique_for(nodes) if self.paths.unique(nodes) else None
                self.stack += (("a", nodes, 0, "value", unique),)
        elif byte == ord("}") or byte == ord("]"):
            if self.stack:
                self.stack = self.stack[:-1]
                self._value_end(at + 1)
        elif byte == ord(","):
            self._next_member()
        elif byte == ord(":") and self.stack and self.stack[-1][0] == "o":
            self.stack = self.stack[:-1] + (self.stack[-1][:3] + ("value",),)

    def _unique_for(self, nodes: NodeSet) -> Unique:
        domain = self.paths.item_domain(nodes)
        if domain is not None:
            return Unique(unused=sorted_texts(domain))
        strings = self.paths.item_strings(nodes)
        integers = self.paths.item_integers(nodes)
        return (
            Unique(language=strings[0], literals=strings[1], integers=integers)
            if strings
            else Unique(integers=integers)
        )

    def _value_start(self, at: int) -> None:
        """A value begins at `at` in the top frame: a guarded array notes where its item began."""
        unique = self._top_unique()
        if unique is not None:
            self.stack = self.stack[:-1] + (self.stack[-1][:4] + (unique.starting(at),),)

    def _child_nodes(self) -> NodeSet:
        """The schemas that may apply to the container value starting in the top frame."""
        if not self.stack:
            return self.paths.root()
        frame = self.stack[-1]
        return self.paths.child(frame[1], frame[2] if frame[2] is not None else "")

    def _value_end(self, end: int) -> None:
        """The value of the top frame's current member ended at `end`: check and record a guarded item."""
        if not self.stack:
            return
        frame = self.stack[-1]
        if frame[0] == "o":
            self.stack = self.stack[:-1] + (frame[:3] + ("comma",),)
            self.closing = self._closing_repeats(end)
            return
        unique = frame[4]
        if unique is not None and unique.start >= 0:
            text = bytes(self.buffer[unique.start : end])
            judged, exact = item_keys(text)
            if unique.holds(judged, exact):
                self.duplicate = True
                return
            unique = unique.adding(judged, exact, text)
        self.stack = self.stack[:-1] + (("a", frame[1], frame[2], "comma", unique),)

    def _closing_repeats(self, end: int) -> bool:
        """The top object is an item of a guarded array (its parent frame) and, closed right after
        its member value that ended at `end`, it would equal an earlier item."""
        if len(self.stack) < 2:
            return False
        unique = _unique_of(self.stack[-2])
        if unique is None or unique.start < 0 or self.buffer[unique.start] != ord("{"):
            return False
        return unique.holds(*item_keys(bytes(self.buffer[unique.start : end]) + b"}"))

    def _key_end(self, end: int) -> None:
        frame = self.stack[-1]
        try:
            key = json.loads(bytes(self.buffer[self.start : end]))
        except ValueError:
            key = ""
        self.stack = self.stack[:-1] + (("o", frame[1], key, "colon"),)

    def _next_member(self) -> None:
        if not self.stack:
            return
        frame = self.stack[-1]
        if frame[0] == "o":
            self.stack = self.stack[:-1] + (("o", frame[1], None, "key"),)
        else:
            unique = frame[4]
            if unique is not None and (unique.unused == () or unique.exhausted()):
                self.duplicate = True  # a finite domain (or strings that run out) used up: any further item repeats one
            self.stack = self.stack[:-1] + (("a", frame[1], frame[2] + 1, "value", unique),)


def _unique_of(frame: tuple) -> Unique | None:
    return frame[4] if frame[0] == "a" else None


def _string_run_end(data: bytes, at: int) -> int:
    """The index of the first quote or backslash in `data` from `at` (its length if none)."""
    quote, backslash = data.find(b'"', at), data.find(b"\\", at)
    if quote < 0:
        return len(data) if backslash < 0 else backslash
    return quote if backslash < 0 or quote < backslash else backslash
