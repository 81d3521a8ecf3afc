"""The request field of budget steering (read at admission: `fd_guided.admission.parse`)."""

from __future__ import annotations

from ..admission.parse import FIT_BUDGET_FIELD as FIELD
from ..admission.parse import fit_budget_requested

__all__ = ["FIELD", "fit_budget_requested"]
