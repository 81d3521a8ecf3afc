"""The host-patching entry that the engine checker and the worker backend call, without importing
`hooks` (which imports them to patch FastDeploy): `hooks` installs its patcher here at import.

Nothing is patched unless the plugin was registered (`hooks.register`), so calling
`ensure_host_patched` before `hooks` is imported, or in a process that never registered the
plugin, does nothing.
"""

from __future__ import annotations

from collections.abc import Callable

_patcher: Callable[[], None] | None = None


def install_patcher(patcher: Callable[[], None]) -> None:
    """Called once by `hooks` at import: `patcher` applies every patch whose module is loaded."""
    global _patcher
    _patcher = patcher


def ensure_host_patched() -> None:
    """Apply the host patches now (idempotent); a no-op until `hooks` is loaded and registered."""
    if _patcher is not None:
        _patcher()
