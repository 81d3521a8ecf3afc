"""The request field of budget steering, read at admission."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import InvalidGrammarError

FIELD = "guided_fit_budget"


def fit_budget_requested(fields: Mapping[str, Any]) -> bool:
    """Whether a request's guided output is steered to end complete within its ``max_tokens``:
    ``guided_fit_budget`` (default true; false turns it off). Raises InvalidGrammarError for a
    value that is not a boolean."""
    value = fields.get(FIELD) if isinstance(fields, Mapping) else None
    if value is None:
        return True
    if not isinstance(value, bool):
        raise InvalidGrammarError(f"must be a boolean, got {type(value).__name__}", part=FIELD)
    return value
