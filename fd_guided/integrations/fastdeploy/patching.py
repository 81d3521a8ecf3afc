"""Installing methods on a FastDeploy class, once: the helper `speculative` and `mtp` share."""

from __future__ import annotations

from collections.abc import Callable


def install_methods(cls, mark: str, methods: dict[str, Callable]) -> None:
    """Set each of `methods` on `cls`, every one carrying `mark`, and mark `cls` (callers skip a
    class that carries it already: FastDeploy's modules may be patched from several entry points)."""
    for name, method in methods.items():
        setattr(method, mark, True)
        setattr(cls, name, method)
    setattr(cls, mark, True)
