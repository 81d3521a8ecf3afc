"""What the compile service and its worker processes need of a backend beyond `GuidedBackend`.

Two small protocols, kept out of the base interface (which a third-party engine implements):

  - `CompositeBackend`: a backend that serves each request with one of several *engine* backends
    (``auto``: xgrammar or llguidance). It names the engines that may compile a spec, preferred
    first, and hands out each engine's backend. Any other backend is its own single engine.
  - `ProcessCompilable`: a backend that can be rebuilt in a compile worker process from a
    picklable recipe, ``("module:factory", kwargs)``, and cloned there with another config. A
    backend without one compiles in threads (no kill on budget).

The functions below (`compile_engines`, `engine`, `engine_names`, `static_refusals`,
`expected_gain_s`, `worker_recipe`, `with_config`, `from_recipe`) are the one place the compile service, its pool
and its workers ask these questions, for any backend.
"""

from __future__ import annotations

import abc
import importlib
from typing import Any, Protocol, runtime_checkable

from ..config import GuidedConfig
from ..interface import GuidedBackend
from ..spec import GrammarSpec

Recipe = tuple[str, dict]


class CompositeBackend(GuidedBackend):
    """A backend over several engine backends; each compiled grammar belongs to one of them."""

    @classmethod
    @abc.abstractmethod
    def compile_engines(cls, spec: GrammarSpec) -> tuple[str, ...]:
        """The engines that may compile `spec`, preferred first. Admission-cheap (pure Python).
        Raises InvalidGrammarError when none can enforce `spec`."""

    @classmethod
    def static_refusals(cls, spec: GrammarSpec) -> list[tuple[str, Any]]:
        """(engine, InvalidGrammarError) for each engine whose admission check refused `spec`:
        named beside the compile errors when every candidate engine failed."""
        return []

    @property
    @abc.abstractmethod
    def engine_names(self) -> tuple[str, ...]:
        """Every engine this backend can compile with."""

    @abc.abstractmethod
    def engine(self, name: str) -> GuidedBackend:
        """The backend that compiles, serializes and runs the grammars of engine `name`."""

    def expected_gain_s(self, engine: str, over: str) -> float:
        """Seconds a request is expected to save over its whole life by running on `engine`
        rather than on `over`, both compiled (cheaper masks times the rows a request needs): how
        long a request ready on `over` may wait for `engine`'s compile. 0 when not known."""
        return 0.0


@runtime_checkable
class ProcessCompilable(Protocol):
    """A backend the compile pool can rebuild in a worker process (see the module docstring)."""

    def worker_recipe(self) -> Recipe:
        """``("module:factory", kwargs)``, picklable; ``kwargs["config"]`` is the backend's config."""
        ...

    def with_config(self, config: GuidedConfig) -> GuidedBackend:
        """This backend with another config, sharing its tokenizer tables."""
        ...


def compile_engines(backend: GuidedBackend, spec: GrammarSpec) -> tuple[str, ...]:
    if isinstance(backend, CompositeBackend):
        return tuple(backend.compile_engines(spec))
    type(backend).check(spec)
    return (backend.name,)


def static_refusals(backend: GuidedBackend, spec: GrammarSpec) -> list[tuple[str, Any]]:
    return backend.static_refusals(spec) if isinstance(backend, CompositeBackend) else []


def engine_names(backend: GuidedBackend) -> tuple[str, ...]:
    return backend.engine_names if isinstance(backend, CompositeBackend) else (backend.name,)


def engine(backend: GuidedBackend, name: str) -> GuidedBackend:
    if isinstance(backend, CompositeBackend):
        return backend.engine(name)
    if name != backend.name:
        raise KeyError(f"backend {backend.name!r} has no engine {name!r}")
    return backend


def expected_gain_s(backend: GuidedBackend, engine: str, over: str) -> float:
    return max(0.0, backend.expected_gain_s(engine, over)) if isinstance(backend, CompositeBackend) else 0.0


def worker_recipe(backend: GuidedBackend) -> Recipe | None:
    """The backend's recipe, or None when it cannot be rebuilt in a worker (it compiles in threads)."""
    recipe = getattr(backend, "worker_recipe", None)
    return recipe() if callable(recipe) else None


def with_config(backend: GuidedBackend, config: GuidedConfig) -> GuidedBackend:
    """`backend` with `config`: its own `with_config`, else the standard constructor."""
    if config == backend.config:
        return backend
    if isinstance(backend, ProcessCompilable):
        return backend.with_config(config)
    return type(backend)(
        backend.tokenizer,
        vocab_size=backend.vocab_size,
        config=config,
        stop_token_ids=backend.stop_token_ids,
    )


def from_recipe(recipe: Recipe) -> GuidedBackend:
    """Instantiate a backend from its `worker_recipe`: the factory called with the kwargs."""
    path, kwargs = recipe
    module_name, _, attribute = path.partition(":")
    factory = getattr(importlib.import_module(module_name), attribute)
    return factory(**kwargs)
