"""One step's rows: which grammar state each logits row is masked with, and the fill that makes it.

A request contributes one row per node of its `DraftTree`: node 0 is the state after its accepted
tokens (the only node of a plain decode step), node i >= 1 the state after the draft path from
the root to node i. `plan_nodes` says, per node, what its row is:

  ``free``     inside a reasoning section: not masked
  ``forced``   reasoning budget spent: only the next think-end marker token is allowed
  ``grammar``  masked with the grammar advanced by `path` (the draft tokens past the section)
  ``stop``     the path ends with a stop token the grammar accepts: the request ends there, so the
               row allows only stop tokens
  ``invalid``  the path holds a draft the grammar rejects, or goes through a dead end or past a
               stop: the chain ended before it. The row allows only stop tokens (never an all
               -inf row), and the host must not accept the draft leading into it.

`fill_trees` fills the ``grammar`` rows of many requests with ONE matcher each: it walks each
request's nodes in order, moving its matcher by `rollback` to the common prefix and `accept_tokens`
for the rest, and fills the rows of every request's next node in one `fill_bitmasks` call (for
chains that is one parallel fill per draft depth). Stop tokens are never pushed: a stop draft is
valid when its parent's row allows it. A root row in its budget's closing zone is written from
its few candidate tokens instead (`TreeFill.candidates`, `fd_guided.budget.closing`), filled only
when the matcher accepts none of them. Every matcher ends where it started.
"""

from __future__ import annotations

from collections.abc import Generator, Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..budget.closing import write_closing_row
from ..interface import Grammar, GuidedBackend
from ..reasoning import ReasoningState
from .slot import allows

FREE, FORCED, GRAMMAR, STOP, INVALID = "free", "forced", "grammar", "stop", "invalid"


@dataclass(frozen=True)
class DraftTree:
    """Draft tokens of one request. `tokens[i - 1]` is node i's token and `parents[i - 1]` its
    parent (a node index < i); node 0 is the root. A chain of K drafts has parents 0..K-1."""

    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError(
                f"a draft tree needs one parent per token: {len(self.tokens)} tokens, {len(self.parents)} parents"
            )
        for node, parent in enumerate(self.parents, start=1):
            if not 0 <= parent < node:
                raise ValueError(f"draft node {node} has parent {parent}: parents must come before their children")

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> DraftTree:
        return cls(tuple(int(t) for t in tokens), tuple(range(len(tokens))))

    @classmethod
    def of(cls, drafts: DraftTree | Sequence[int] | None) -> DraftTree:
        if drafts is None:
            return EMPTY
        return drafts if isinstance(drafts, DraftTree) else cls.chain(drafts)

    @property
    def num_nodes(self) -> int:
        return len(self.tokens) + 1

    @property
    def is_chain(self) -> bool:
        return self.parents == tuple(range(len(self.tokens)))

    def child(self, node: int, token: int) -> int | None:
        """The first child of `node` holding `token`, or None."""
        for index, (candidate, parent) in enumerate(zip(self.tokens, self.parents), start=1):
            if parent == node and candidate == token:
                return index
        return None


EMPTY = DraftTree()


@dataclass
class NodePlan:
    kind: str
    forced: int | None = None
    path: tuple[int, ...] = ()


def plan_nodes(tree: DraftTree, reasoning: ReasoningState | None, stop_ids: frozenset[int]) -> list[NodePlan]:
    """What each node's row is (see the module docstring), before any grammar is consulted."""
    plans: list[NodePlan] = []
    states: list[ReasoningState | None] = []
    for node in range(tree.num_nodes):
        state: ReasoningState | None
        path: tuple[int, ...]
        if node == 0:
            state, path = reasoning, ()
        else:
            token, parent = tree.tokens[node - 1], tree.parents[node - 1]
            above = plans[parent]
            if above.kind in (INVALID, STOP) or (above.kind == FORCED and token != above.forced):
                plans.append(NodePlan(INVALID))
                states.append(None)
                continue
            if above.kind in (FREE, FORCED):
                if token in stop_ids:  # a stop token inside the reasoning section ends the request
                    plans.append(NodePlan(STOP))
                    states.append(None)
                    continue
                above_state = states[parent]
                assert above_state is not None  # a free or forced node has its reasoning state
                state, path = above_state.step(token), ()
            else:
                state, path = None, above.path + (token,)
        states.append(state)
        if state is not None and state.thinking:
            forced = state.forced_token()
            plans.append(NodePlan(FREE) if forced is None else NodePlan(FORCED, forced=forced))
        else:
            plans.append(NodePlan(GRAMMAR, path=path))
    return plans


@dataclass
class TreeFill:
    """One request's grammar rows to fill: (row, node, parent node, path) per ``grammar`` node, in
    node order. After `fill_trees`: `invalid` and `stops` hold node numbers, `root_dead` whether
    the root row allowed nothing."""

    grammar: Grammar
    nodes: list[tuple[int, int, int, tuple[int, ...]]]
    first_row: int
    invalid: set[int] = field(default_factory=set)
    stops: set[int] = field(default_factory=set)
    root_dead: bool = False
    # A row in its budget's closing zone (fd_guided.budget.closing): the few tokens it may allow,
    # checked one by one instead of a full fill; `closed` once its row was written from them.
    candidates: tuple[int, ...] | None = None
    closed: bool = False
    # A plain root row whose state repeats across requests (`fd_guided.manager.first_masks`): its
    # key there; the fill copies the row kept for it, or keeps the row it fills.
    first_mask: Hashable | None = None
    # Set once that row was copied (not filled). Not `closed`: budget steering reads `closed` as
    # "written from its candidates" and would leave a copied row unrestricted.
    copied: bool = False


def fill_trees(backend: GuidedBackend, bitmask, words: np.ndarray, jobs: Sequence[TreeFill]) -> None:
    """Fill every job's rows, one node per job per batch fill (see the module docstring)."""
    stop_ids = frozenset(backend.stop_token_ids)
    for job in jobs:
        if job.candidates is not None:
            job.closed = write_closing_row(job.grammar, job.candidates, words[job.first_row])
    jobs = [job for job in jobs if not job.closed and not job.copied]
    walkers = [_walk(job, words, stop_ids) for job in jobs]
    started: list[tuple[Generator[int, bool, None], TreeFill, int | None]] = [
        (walker, job, next(walker, None)) for walker, job in zip(walkers, jobs)
    ]
    try:
        while True:
            pending = [(walker, job, row) for walker, job, row in started if row is not None]
            if not pending:
                return
            backend.fill_bitmasks([job.grammar for _, job, _ in pending], bitmask, [row for _, _, row in pending])
            started = [(walker, job, _send(walker, not words[row].any())) for walker, job, row in pending]
    finally:
        for walker in walkers:
            walker.close()  # every matcher back at its start state, even on an error


def _send(walker: Generator[int, bool, None], empty: bool) -> int | None:
    try:
        return walker.send(empty)
    except StopIteration:
        return None


def _walk(job: TreeFill, words: np.ndarray, stop_ids: frozenset[int]) -> Generator[int, bool, None]:
    """Position job.grammar at each node's path in turn and yield the row to fill; receives
    whether the filled row came out empty."""
    grammar, current = job.grammar, list[int]()
    try:
        for row, node, parent, path in job.nodes:
            if parent in job.invalid or parent in job.stops:
                job.invalid.add(node)
                continue
            if path and path[-1] in stop_ids:
                # The parent's row was filled in an earlier round: a stop draft is valid iff allowed
                # there (stop tokens are never pushed: the request would end at them anyway).
                (job.stops if allows(words[job.first_row + parent], path[-1]) else job.invalid).add(node)
                continue
            common = 0
            while common < min(len(current), len(path)) and current[common] == path[common]:
                common += 1
            if len(current) > common:
                grammar.rollback(len(current) - common)
                del current[common:]
            rest = path[common:]
            accepted = grammar.accept_tokens(rest) if rest else 0
            current.extend(rest[:accepted])
            if accepted < len(rest) or grammar.is_terminated():
                job.invalid.add(node)
                continue
            empty = yield row
            if empty:
                if node == 0:
                    job.root_dead = True
                    return
                job.invalid.add(node)
    finally:
        if current:
            grammar.rollback(len(current))


@dataclass
class StepEntry:
    """One request's rows in the current step: `tree.num_nodes` rows from `first_row`."""

    slot: int | None
    first_row: int
    tree: DraftTree
    plans: list[NodePlan] | None = None  # None: its rows are not masked (unguided, prefilling)
    fill: TreeFill | None = None
    stopped: bool = False  # every row allows only stop tokens (finished or failed)
    limit: int = 0

    def path_of(self, tokens: list[int]) -> list[int]:
        """The node each of `tokens` is sampled at: the root, then the draft children they follow."""
        path: list[int] = []
        node = 0
        for j, token in enumerate(tokens):
            path.append(node)
            if j + 1 < len(tokens):
                child = self.tree.child(node, token)
                if child is None:
                    raise ValueError(
                        f"slot {self.slot}: accepted token {j} ({token}) is not a draft of the path "
                        "(only the last accepted token may be sampled off the drafts)"
                    )
                node = child
        return path
