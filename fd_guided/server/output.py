"""One choice's text as it grows: incremental detokenization, stop strings, and text held back.

Each step adds tokens; `ChoiceText.add` returns the text that is now safe to send to a streaming
client. Held back: a trailing incomplete UTF-8 sequence (it decodes to U+FFFD until its last byte
arrives), a suffix that may be the start of a stop string, and, for tool calling, everything from
the tool-call trigger on (a call is sent whole, once parsed). A stop string found ends the choice:
the text is cut before it (OpenAI semantics; a guided output cut this way may be incomplete, as
anywhere else).
"""
from __future__ import annotations

from typing import Sequence

from ..tokenizer import TokenizerBundle


class ChoiceText:
    """Args:
        tokenizer: decodes the generated ids.
        stop: stop strings (the text ends before the first one found).
        hold_from: text from this marker on is never sent by `add` (None: no marker).
        hold_all: `add` sends nothing (the caller sends the final text itself).
    """

    def __init__(self, tokenizer: TokenizerBundle, stop: Sequence[str] = (), *, hold_from: str | None = None,
                 hold_all: bool = False):
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.hold_from = hold_from or None
        self.hold_all = hold_all
        self.token_ids: list[int] = []
        self.text = ""
        self.sent = 0
        self.stopped = False

    def add(self, token_ids: Sequence[int]) -> str:
        """Take new tokens; return the text newly safe to send. After a stop string, nothing."""
        if self.stopped:
            return ""
        self.token_ids.extend(token_ids)
        self.text = self.tokenizer.decode(self.token_ids)
        cut = self._first_stop()
        if cut is not None:
            self.text, self.stopped = self.text[:cut], True
            return self._send_up_to(self._held_limit(final=True))
        return self._send_up_to(self._held_limit(final=False))

    def rest(self) -> str:
        """At the end: everything not sent yet (tool-call callers take `text` instead)."""
        return self._send_up_to(len(self.text))

    def _first_stop(self) -> int | None:
        found = [index for index in (self.text.find(stop) for stop in self.stop) if index >= 0]
        return min(found) if found else None

    def _held_limit(self, final: bool) -> int:
        if self.hold_all:
            return self.sent
        limit = len(self.text)
        if not final:
            # An incomplete UTF-8 sequence decodes to U+FFFD until its last byte arrives.
            limit = len(self.text.rstrip("\ufffd"))
            for stop in self.stop:
                limit = min(limit, len(self.text) - _partial_suffix(self.text, stop))
        if self.hold_from is not None:
            marker = self.text.find(self.hold_from)
            limit = min(limit, marker if marker >= 0 else len(self.text) - _partial_suffix(self.text, self.hold_from))
        return max(limit, self.sent)

    def _send_up_to(self, limit: int) -> str:
        delta = self.text[self.sent:limit]
        self.sent = max(self.sent, limit)
        return delta


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0
