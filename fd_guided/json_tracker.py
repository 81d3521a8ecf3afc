"""Moved to `fd_guided.unique.tracker`; this name stays for imports that use it."""

from .unique.tracker import AFTER_QUOTE, CLASS_BYTES, LITERAL_START, QUOTE, STRUCTURAL, JsonTracker, item_keys  # noqa: F401
