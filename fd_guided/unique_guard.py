"""Moved to `fd_guided.unique.guard`; this name stays for imports that use it (backends.auto)."""

from .unique.guard import (  # noqa: F401
    TokenClasses,
    UniqueItemsGrammar,
    needs_guard,
    restrict_rows,
    token_classes,
    unguarded,
    with_unique_guard,
)
