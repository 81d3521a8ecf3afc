"""An adversarial decoder for budget tests: it never ends a string and never ends anything early.

Among the tokens a row allows it picks, in order: whitespace-only tokens, then tokens that hold
none of ``"]}`` and no stop (they extend a string or a number, or open something), the longest
first; a stop token only when nothing else is allowed. Left alone under a mask it would write one
string forever: only budget steering ends its outputs. `pick_opener` opens whatever it may first.
"""

from __future__ import annotations

import functools

import numpy as np


@functools.lru_cache(maxsize=2)
def _scores(tokenizer, vocab: int) -> np.ndarray:
    scores = np.full(vocab, -1.0)
    for token, text in enumerate(tokenizer.token_bytes):
        if not text:
            continue
        if text.isspace():
            scores[token] = 1000 + len(text)
        elif not any(c in text for c in b'"]}'):
            scores[token] = 100 + len(text)
        else:
            scores[token] = len(text)
    for stop in tokenizer.eos_token_ids:
        scores[stop] = -0.5
    return scores


@functools.lru_cache(maxsize=2)
def _opener_scores(tokenizer, vocab: int) -> np.ndarray:
    scores = _scores(tokenizer, vocab).copy()
    for token, text in enumerate(tokenizer.token_bytes):
        if text and text[:1] in (b"{", b"[", b","):
            scores[token] = 2000 - len(text)
    return scores


def pick(tokenizer, words: np.ndarray, vocab: int) -> int:
    """The adversary's token for a bitmask row (int32 words)."""
    allowed = np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab].astype(bool)
    scores = np.where(allowed, _scores(tokenizer, vocab), -np.inf)
    return int(np.argmax(scores))


def pick_opener(tokenizer, words: np.ndarray, vocab: int) -> int:
    """The opener: before anything else a token that opens an object or array or goes on to the
    next member (``{``, ``[``, ``,``: an optional property, one more item, the object branch of an
    ``anyOf`` with ``null``), the shortest first; otherwise as `pick`."""
    allowed = np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab].astype(bool)
    scores = np.where(allowed, _opener_scores(tokenizer, vocab), -np.inf)
    return int(np.argmax(scores))
