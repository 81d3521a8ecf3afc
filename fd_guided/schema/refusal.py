"""The two ways a schema rewrite can fail, raised inside `fd_guided.schema` and turned into
`InvalidGrammarError` by its public entry points (`fd_guided.schema.for_engine`).

- `Refusal`: the schema is valid but uses something the target engine cannot be made to enforce
  exactly; `feature` names the keyword (so `auto` may try another engine), `location` the JSON
  path (``$.properties.a.pattern``).
- `Unsatisfiable`: no JSON value is valid (``false``, ``{"enum": []}``, ``minimum`` > ``maximum``,
  ...): a request error every engine would make, not a missing feature.
"""

from __future__ import annotations


class Refusal(Exception):
    def __init__(self, feature: str, location: str = "$"):
        super().__init__(f"{feature} at {location}")
        self.feature = feature
        self.location = location


class Unsatisfiable(Exception):
    def __init__(self, reason: str, location: str = "$"):
        super().__init__(f"{reason} at {location}")
        self.reason = reason
        self.location = location
