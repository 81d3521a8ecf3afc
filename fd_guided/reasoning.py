"""Reasoning sections: where the constraint starts, detected across tokens, with a token budget.

A reasoning model writes a free-form section first and ends it with a *think-end marker*: one
token (DeepSeek-R1's ``</think>``), several tokens (``</think>`` spelled as text by a tokenizer
without a special token for it: ``</``, ``think``, ``>``), or a channel switch such as gpt-oss's
``<|end|><|start|>assistant<|channel|>final<|message|>``. A `ReasoningMarker` is one or more such
token-id sequences; the section ends when the generated tokens end with any of them. Matching is
on token ids, as vLLM and FastDeploy's reasoning parsers do: a marker is a fixed piece of the chat
template, so a serving stack knows its ids.

`ReasoningState` is immutable: `step(token)` returns the next state, so speculative decoding can
follow every draft path from one state without undoing anything. With a `budget`, once that many
reasoning tokens were generated the state `forced_token()` names the next token of the (first)
marker, continuing a partial match: the manager masks that row to it alone, so the section closes
in ``len(marker)`` steps at most and the constraint starts.

When a request starts in a reasoning section (`starts_in_reasoning`): only when the host says
``enable_thinking=True`` and the prompt has not already closed the section (a chat template that
disables thinking writes an empty, closed section into the prompt). ``False`` and unset (None)
constrain from the first token: a request is never unconstrained by omission.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union

MarkerLike = Union[int, Sequence[int], Sequence[Sequence[int]], "ReasoningMarker", None]


@dataclass(frozen=True)
class ReasoningMarker:
    """Token-id sequences that end a reasoning section; the first is the one a budget forces."""

    sequences: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if not self.sequences or any(not seq for seq in self.sequences):
            raise ValueError("a reasoning marker needs at least one non-empty token sequence")
        for seq in self.sequences:
            for token in seq:
                if not isinstance(token, int) or isinstance(token, bool) or token < 0:
                    raise ValueError(f"reasoning marker token ids must be non-negative ints, got {token!r}")

    @classmethod
    def of(cls, value: MarkerLike) -> ReasoningMarker | None:
        """An int (one token), a sequence of ints (one multi-token marker), a sequence of such
        sequences (alternatives), a marker, or None (no reasoning)."""
        if value is None or isinstance(value, ReasoningMarker):
            return value
        if isinstance(value, int):
            return cls(((int(value),),))
        items: list[Any] = list(value)  # ints, or sequences of ints (told apart below)
        if items and all(isinstance(item, int) for item in items):
            return cls((tuple(int(t) for t in items),))
        return cls(tuple(tuple(int(t) for t in item) for item in items))

    @property
    def longest(self) -> int:
        return max(len(seq) for seq in self.sequences)

    @property
    def single_token(self) -> int | None:
        """The id when the marker is exactly one single-token sequence (the classic ``think_end_id``)."""
        return self.sequences[0][0] if len(self.sequences) == 1 and len(self.sequences[0]) == 1 else None

    def found_in(self, token_ids: Sequence[int]) -> bool:
        """True if any marker sequence occurs in `token_ids` (e.g. a prompt that closed the section)."""
        ids = list(token_ids)
        for seq in self.sequences:
            n = len(seq)
            first = seq[0]
            for start in range(len(ids) - n + 1):
                if ids[start] == first and tuple(ids[start : start + n]) == seq:
                    return True
        return False


def marker_from_text(tokenizer, text: str) -> ReasoningMarker:
    """The marker for `text` with `tokenizer` (a `TokenizerBundle`): its special token when the
    vocabulary has one spelled exactly so, and the plain encoding of the text, either ending it."""
    sequences: list[tuple[int, ...]] = []
    hf = getattr(tokenizer, "hf_tokenizer", None)
    if hf is not None:
        special = hf.get_vocab().get(text)
        if special is not None:
            sequences.append((int(special),))
    encoded = tuple(int(t) for t in tokenizer.encode(text))
    if encoded and encoded not in sequences:
        sequences.append(encoded)
    if not sequences:
        raise ValueError(f"the tokenizer encodes the reasoning marker {text!r} to no tokens")
    return ReasoningMarker(tuple(sequences))


@dataclass(frozen=True)
class ReasoningState:
    """Where one request stands in its reasoning section (immutable; `step` returns a new state).

    `thinking`: still inside the section. `tail`: the last ``longest - 1`` tokens generated in it
    (enough to see a marker complete). `spent`: reasoning tokens generated so far. `budget`: how
    many are allowed before the marker is forced (None: no limit).
    """

    marker: ReasoningMarker
    thinking: bool = True
    tail: tuple[int, ...] = ()
    spent: int = 0
    budget: int | None = None

    def step(self, token: int) -> ReasoningState:
        """The state after one more generated token (a no-op once the section has ended)."""
        if not self.thinking:
            return self
        window = self.tail + (int(token),)
        ended = any(window[-len(seq) :] == seq for seq in self.marker.sequences if len(seq) <= len(window))
        keep = self.marker.longest - 1
        return ReasoningState(self.marker, not ended, window[-keep:] if keep else (), self.spent + 1, self.budget)

    def forced_token(self) -> int | None:
        """The token the next row must be (the budget is spent: the marker is being forced), else None.

        Continues the longest partial match of the first marker sequence, so a model that had
        begun writing the marker is not made to start it over.
        """
        if not self.thinking or self.budget is None or self.spent < self.budget:
            return None
        seq = self.marker.sequences[0]
        for matched in range(min(len(seq) - 1, len(self.tail)), 0, -1):
            if self.tail[-matched:] == seq[:matched]:
                return seq[matched]
        return seq[0]


def starts_in_reasoning(
    marker: ReasoningMarker | None, prompt_token_ids: Sequence[int], enable_thinking: bool | None
) -> bool:
    """See the module docstring: True only for ``enable_thinking=True`` and a prompt without a marker."""
    if marker is None or enable_thinking is not True:
        return False
    return not marker.found_in(prompt_token_ids)


__all__ = ["ReasoningMarker", "ReasoningState", "marker_from_text", "starts_in_reasoning"]
