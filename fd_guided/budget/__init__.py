"""Complete within budget: a guided request with ``max_tokens`` ends with a complete, valid output.

`search.shortest_completion` finds a real completion of a matcher's state, measured in tokens of
the request's tokenizer; `steer.BudgetSteering` (one per manager) keeps each budgeted slot's plan
and restricts its rows once the budget left would not cover more. `fit_budget_requested` reads the
request field that turns it off (``guided_fit_budget: false``); `BudgetTooSmallError` (a 400) refuses
a budget below the shortest output (`minimum`: at admission when known, else once compiled).
"""

from .minimum import BudgetTooSmallError
from .request import FIELD, fit_budget_requested
from .search import Completion, shortest_completion, token_table
from .steer import BudgetSteering

__all__ = [
    "BudgetSteering",
    "BudgetTooSmallError",
    "Completion",
    "FIELD",
    "fit_budget_requested",
    "shortest_completion",
    "token_table",
]
