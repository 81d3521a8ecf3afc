"""One choice's text as it grows: incremental detokenization, stop strings, and text held back.

Each step adds tokens; `ChoiceText.add` returns the text that is now safe to send to a streaming
client. Decoding is incremental (each token's bytes once, through a UTF-8 decoder that keeps an
incomplete trailing sequence until its last byte arrives) and stop strings are searched only where
the new text can complete one, so a token costs the same at the 4,000th as at the first: this runs
on the event loop, once per token per streaming choice. Held back: a suffix that may be the start
of a stop string, and, for tool calling, everything from the tool-call trigger on (a call is sent
whole, once parsed). A stop string found ends the choice:
the text is cut before it (OpenAI semantics; a guided output cut this way may be incomplete, as
anywhere else).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from fd_guided.tokenizer import TokenizerBundle


class ChoiceText:
    """Args:
    tokenizer: decodes the generated ids.
    stop: stop strings (the text ends before the first one found).
    hold_from: text from this marker on is never sent by `add` (None: no marker).
    hold_all: `add` sends nothing (the caller sends the final text itself).
    """

    def __init__(
        self,
        tokenizer: TokenizerBundle,
        stop: Sequence[str] = (),
        *,
        hold_from: str | None = None,
        hold_all: bool = False,
    ):
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.hold_from = hold_from or None
        self.hold_all = hold_all
        self.text = ""
        self.sent = 0
        self.stopped = False
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._longest_stop = max((len(stop) for stop in self.stop), default=0)
        self._marker_at = -1

    def add(self, token_ids: Sequence[int], final: bool = False) -> str:
        """Take new tokens (`final`: the last ones; an incomplete UTF-8 tail then decodes to U+FFFD,
        as a whole decode gives); return the text newly safe to send. After a stop string, nothing."""
        if self.stopped:
            return ""
        searched_to = max(0, len(self.text) - self._longest_stop + 1)
        self.text += self._utf8.decode(self.tokenizer.decode_bytes(token_ids), final)
        cut = self._first_stop(searched_to)
        if cut is not None:
            self.text, self.stopped = self.text[:cut], True
            return self._send_up_to(self._held_limit(final=True))
        return self._send_up_to(self._held_limit(final=False))

    def rest(self) -> str:
        """At the end: everything not sent yet (tool-call callers take `text` instead)."""
        flushed = "" if self.stopped else self.add((), final=True)
        return flushed + self._send_up_to(len(self.text))

    def _first_stop(self, start: int) -> int | None:
        """The first stop string starting at or after `start` (earlier ones were found before)."""
        found = [index for index in (self.text.find(stop, start) for stop in self.stop) if index >= 0]
        return min(found) if found else None

    def _held_limit(self, final: bool) -> int:
        if self.hold_all:
            return self.sent
        limit = len(self.text)
        if not final:
            for stop in self.stop:
                limit = min(limit, len(self.text) - _partial_suffix(self.text, stop))
        if self.hold_from is not None:
            if self._marker_at < 0:
                self._marker_at = self.text.find(self.hold_from, max(0, self.sent - len(self.hold_from)))
            marker = self._marker_at
            limit = min(limit, marker if marker >= 0 else len(self.text) - _partial_suffix(self.text, self.hold_from))
        return max(limit, self.sent)

    def _send_up_to(self, limit: int) -> str:
        delta = self.text[self.sent : limit]
        self.sent = max(self.sent, limit)
        return delta


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0
