"""Backends by name: the built-ins plus anything installed under the ``fd_guided.backends`` group.

A third party ships a backend by declaring, in its own package metadata::

    [project.entry-points."fd_guided.backends"]
    mybackend = "my_pkg.backend:MyBackend"

Two different classes under one name are refused (`DuplicateBackendError`), whichever way they
were registered, so a plugin can never silently replace a built-in.
"""

from __future__ import annotations

import importlib
import threading
from importlib.metadata import entry_points

from .errors import BackendNotFoundError, DuplicateBackendError

ENTRY_POINT_GROUP = "fd_guided.backends"
BUILTIN_BACKENDS = {
    "xgrammar": "fd_guided.backends.xgrammar:XGrammarBackend",
    "llguidance": "fd_guided.backends.llguidance:LLGuidanceBackend",
    "auto": "fd_guided.backends.auto:AutoBackend",
}

_lock = threading.Lock()
_registered: dict[str, str | type] = {}
_entry_points_loaded = False


def register_backend(name: str, target: str | type) -> None:
    """Register a backend class (or its ``module:Class`` path) under `name`.

    Registering the same target twice is a no-op; a different target under a taken name raises.
    """
    with _lock:
        _register_locked(name, target)


def _register_locked(name: str, target: str | type) -> None:
    current = _registered.get(name)
    if current is not None and _target_path(current) != _target_path(target):
        raise DuplicateBackendError(
            f"backend {name!r} is already registered as {_target_path(current)}; refusing {_target_path(target)}"
        )
    _registered[name] = target


def _target_path(target: str | type) -> str:
    return target if isinstance(target, str) else f"{target.__module__}:{target.__qualname__}"


def _ensure_loaded() -> None:
    global _entry_points_loaded
    with _lock:
        if _entry_points_loaded:
            return
        for name, path in BUILTIN_BACKENDS.items():
            _register_locked(name, path)
        for entry in entry_points(group=ENTRY_POINT_GROUP):
            _register_locked(entry.name, entry.value)
        _entry_points_loaded = True


def available_backends() -> list[str]:
    _ensure_loaded()
    return sorted(_registered)


def get_backend_class(name: str) -> type:
    """The backend class registered under `name` (imported on first use)."""
    _ensure_loaded()
    target = _registered.get(name)
    if target is None:
        raise BackendNotFoundError(
            f"no guided-decoding backend named {name!r}; available: {', '.join(available_backends())}"
        )
    if isinstance(target, str):
        module_name, _, attribute = target.partition(":")
        target = getattr(importlib.import_module(module_name), attribute)
    return target


def create_backend(name: str, tokenizer, *, vocab_size: int, config=None):
    """Build the backend registered under `name` for `tokenizer` and a logits width `vocab_size`."""
    return get_backend_class(name)(tokenizer, vocab_size=vocab_size, config=config)
