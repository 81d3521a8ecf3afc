"""``uniqueItems`` enforced while decoding: the guard around an engine's matcher and its JSON tracker.

  guard.py    `UniqueItemsGrammar` (the guard), `with_unique_guard`, `restrict_rows`, `TokenClasses`
  tracker.py  `JsonTracker`: the JSON reader with snapshots and the guard's questions (the Python reference)
  reader.py   `JsonReader`: the byte machine under it (frames, scalars, a guarded array's items)
  items.py    a guarded array's items and the equality they are judged by (`item_keys`)
  native.py   the same decisions in C for the rows whose state it takes (`_native.c` and its files)

Where the guard applies (`schema/unique_paths.py`) and which arrays are left to it
(`schema/unique_items.py`) are the normaliser's business and stay in `fd_guided.schema`.
"""

from .guard import UniqueItemsGrammar, needs_guard, restrict_rows, unguarded, with_unique_guard
from .tracker import JsonTracker, item_keys

__all__ = [
    "JsonTracker",
    "UniqueItemsGrammar",
    "item_keys",
    "needs_guard",
    "restrict_rows",
    "unguarded",
    "with_unique_guard",
]
