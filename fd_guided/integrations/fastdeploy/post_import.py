"""A post-import hook: run a patch right after a given module executes, for modules imported later.

Used by `hooks.py` for FastDeploy modules not yet imported when the plugin registers. It touches
only the spec of the modules it names (its loader is wrapped); ``sys.modules`` is left alone.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
from collections.abc import Callable
from typing import Any


class PostImportHook(importlib.abc.MetaPathFinder):
    """Runs a patch right after its module executes, for modules imported after `register`."""

    def __init__(self, patches: dict[str, Callable[[Any], None]], lock):
        self.patches = patches
        self.lock = lock
        self._finding: set[str] = set()

    def find_spec(self, fullname, path=None, target=None):
        patch = self.patches.get(fullname)
        if patch is None or fullname in self._finding:
            return None
        self._finding.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader, patch, self.lock)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, patch, lock):
        self.loader = loader
        self.patch = patch
        self.lock = lock

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        with self.lock:
            self.patch(module)

    def __getattr__(self, name):  # get_source, get_filename, ... of the real loader
        return getattr(self.loader, name)
