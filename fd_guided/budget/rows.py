"""What budget steering touches of the step being applied: its bitmask rows, which the kernel
masks or sets to stop tokens, and a request's draft rows (`StepRows`, `cut_drafts`, `stop_entry`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

INVALID_PLAN = "invalid"  # fd_guided.manager.plan.INVALID (not imported: the manager imports this package)


def engine_of(state) -> str:
    """The engine that compiled the slot's grammar (its ticket is done once it has a matcher)."""
    try:
        return str(state.ticket.result(timeout=0).backend_name)
    except Exception:  # noqa: BLE001 - no compiled grammar to name: the matcher's type will do
        return type(state.grammar).__name__


@dataclass
class StepRows:
    """What `steer` touches of the step being applied."""

    fail: Callable[[int, Any, str], None]
    words: np.ndarray
    masked: set[int]
    stop_rows: list[int]
    stop_ids: frozenset[int]


def cut_drafts(step: StepRows, entry) -> None:
    """Near the budget a request's drafts are not taken: their rows allow only stop tokens."""
    for node in range(1, entry.tree.num_nodes):
        row = entry.first_row + node
        if row in step.masked:
            step.masked.discard(row)
            step.stop_rows.append(row)
        entry.plans[node] = replace(entry.plans[node], kind=INVALID_PLAN, forced=None, path=())
    entry.limit = 0


def stop_entry(step: StepRows, entry) -> None:
    rows = range(entry.first_row, entry.first_row + entry.tree.num_nodes)
    step.masked.difference_update(rows)
    step.stop_rows.extend(rows)
    entry.stopped, entry.plans = True, None
