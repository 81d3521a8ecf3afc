"""A budgeted request's plan: a real completion of its grammar, and how to spell the rest of it.

`Plan.need` is what the plan still costs in tokens (the fewest tokens spelling the rest of its
text, plus the stop token); `spellings` are the tokens that spell its next bytes, each with what
its rest then needs. Plans are built from a `search.Completion` (`Plan.of`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .search import UNSPELLED, Completion, TokenTable
from .tokens import spelled_from


@dataclass
class Plan:
    """A completion and the fewest tokens spelling each of its suffixes (`fewest[k]`: text[k:])."""

    text: bytes
    fewest: list[tuple[int, int]]
    position: int = 0
    # position -> [(token spelling the next bytes, tokens needed after it)]; shared by the copies
    # of a cached start plan (read-only but for this memo)
    spellings_at: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    # The texts a search off the plan lands on (`search.shortest_completion`): the start plan's
    # and the near-shortest outputs written beside it (`instance.start_landmarks`: an optional
    # address opened, the rest of the variant that holds one completes it), handed down to every
    # re-plan unchanged (one tuple per request: its landing table is built once). A plan made
    # without any has its own text.
    landmarks: tuple[bytes, ...] = ()
    # A start plan's: the most tokens one choice of its schema adds to a completion (an optional
    # property or array item opened, a costlier anyOf branch, type or enum member: `growth`, or a
    # landmark over the plan); 0 where none is known. A request's closing zone is at least this
    # wide (`steer._Slot.headroom`), so no such choice is made without room left to close it.
    growth: int = 0

    def __post_init__(self) -> None:
        if not self.landmarks:
            self.landmarks = (self.text,)

    @classmethod
    def of(cls, completion: Completion, table: TokenTable) -> Plan:
        # The fewest-token spellings, when the completion's (verified) tokens are one of them;
        # else only the completion's own tokens.
        marks = completion.landmarks
        fewest = table.fewest(completion.text)
        if fewest[0][0] < UNSPELLED and spelled_from(table, fewest, 0, len(completion.text)) == list(completion.tokens):
            return cls(completion.text, fewest, landmarks=marks)
        return cls(completion.text, chain(completion, table), landmarks=marks)

    @property
    def need(self) -> int:
        return self.fewest[self.position][0] + 1

    def fresh(self) -> Plan:
        """This plan from its start, sharing its tables (a cached start plan for a new request)."""
        return Plan(self.text, self.fewest, 0, self.spellings_at, self.landmarks, self.growth)

    def spellings(self, table: TokenTable) -> list[tuple[int, int]]:
        """The tokens that spell the plan's next bytes, each with the tokens its rest then needs."""
        found = self.spellings_at.get(self.position)
        if found is None:
            found, start = [], self.position
            for end in table.ends(self.text, start):
                token = table.by_bytes.get(self.text[start:end])
                if token is not None and self.fewest[end][0] < UNSPELLED:
                    found.append((token, self.fewest[end][0]))
            self.spellings_at[self.position] = found
        return found

    def rest_tokens(self, table: TokenTable) -> list[int]:
        tokens, position = [], self.position
        while position < len(self.text):
            token = self.fewest[position][1]
            tokens.append(token)
            position += len(table.bytes_of[token])
        return tokens


def chain(completion: Completion, table: TokenTable) -> list[tuple[int, int]]:
    """`fewest` along the completion's own tokens (when the text has no shorter spelling)."""
    fewest = [(UNSPELLED, -1)] * (len(completion.text) + 1)
    fewest[-1] = (0, -1)
    position = len(completion.text)
    for index in range(len(completion.tokens) - 1, -1, -1):
        token = completion.tokens[index]
        position -= len(table.bytes_of[token])
        fewest[position] = (len(completion.tokens) - index, token)
    return fewest
