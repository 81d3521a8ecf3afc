"""What the compile service and its worker processes need of a backend beyond `GuidedBackend`.

Two small protocols, kept out of the base interface (which a third-party engine implements):

  - `CompositeBackend`: a backend that serves each request with one of several *engine* backends
    (``auto``: xgrammar or llguidance). It names the engines that may compile a spec, preferred
    first, and hands out each engine's backend. Any other backend is its own single engine.
  - `ProcessCompilable`: a backend that can be rebuilt in a compile worker process from a
    picklable recipe, ``("module:factory", kwargs)``, and cloned there with another config. A
    backend without one compiles in threads (no kill on budget).

The functions below (`compile_engines`, `engine`, `engine_names`, `static_refusals`, `remembered_choice`,
`expected_gain_s`, `worker_recipe`, `with_config`, `from_recipe`) are the one place the compile service, its pool
and its workers ask these questions, for any backend.

Which engines may compile a spec is itself work to run off the caller's thread: each engine's check
is the schema normaliser (pure Python, up to hundreds of ms on a large schema). `CHECKS` names a
pseudo-engine whose "compile" is that decision (`EngineChecks`, its outcome an `EngineChoice`), so
the compile service runs it as a job like any other: in a killable compile worker, its outcome cached
beside the grammars and its refusal remembered.
"""

from __future__ import annotations

import abc
import importlib
import json
from typing import Any, Protocol, runtime_checkable

from ..admission.deferred import finish_deferred_checks
from ..config import GuidedConfig
from ..errors import InvalidGrammarError, error_class
from ..interface import CompiledGrammar, Grammar, GuidedBackend
from ..spec import GrammarSpec

Recipe = tuple[str, dict]

# The pseudo-engine of `EngineChecks` (job keys, worker messages, "the engine-checks compile ran
# past its budget" when a check runs away).
CHECKS = "engine-checks"


class CompositeBackend(GuidedBackend):
    """A backend over several engine backends; each compiled grammar belongs to one of them."""

    @classmethod
    @abc.abstractmethod
    def compile_engines(cls, spec: GrammarSpec) -> tuple[str, ...]:
        """The engines that may compile `spec`, preferred first: their checks, pure Python (the
        compile service runs it in a compile worker, `EngineChecks`, never on the caller's thread).
        Raises InvalidGrammarError when none can enforce `spec`."""

    @classmethod
    def static_refusals(cls, spec: GrammarSpec) -> list[tuple[str, Any]]:
        """(engine, InvalidGrammarError) for each engine whose admission check refused `spec`:
        named beside the compile errors when every candidate engine failed."""
        return []

    @classmethod
    def remembered_choice(cls, spec: GrammarSpec) -> EngineChoice | InvalidGrammarError | None:
        """The `EngineChoice` (or the refusal) this process's checks reached for `spec` before,
        if remembered: a lookup, never the checks (those run at admission, within its budget, or
        in a compile worker). None when not known."""
        return None

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


def remembered_choice(backend: GuidedBackend, spec: GrammarSpec) -> EngineChoice | InvalidGrammarError | None:
    return backend.remembered_choice(spec) if isinstance(backend, CompositeBackend) else None


def engine_names(backend: GuidedBackend) -> tuple[str, ...]:
    return backend.engine_names if isinstance(backend, CompositeBackend) else (backend.name,)


def engine(backend: GuidedBackend, name: str) -> GuidedBackend:
    if name == CHECKS:
        return engine_checks(backend)
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


class EngineChoice(CompiledGrammar):
    """The outcome of a backend's checks on one spec, as the compile service keeps it: `engines`
    that may compile it, preferred first (`compile_engines`), and `refusals`, what each other
    engine's check refused (`static_refusals`: named beside the compile errors if every candidate
    fails). Immutable; `to_bytes`/`from_bytes` carry it out of a compile worker."""

    backend_name = CHECKS

    def __init__(
        self, spec: GrammarSpec, engines: tuple[str, ...], refusals: tuple[tuple[str, InvalidGrammarError], ...] = ()
    ):
        self.spec, self.engines, self.refusals = spec, tuple(engines), tuple(refusals)

    @property
    def memory_bytes(self) -> int:
        return 64 * len(self.engines) + sum(len(str(error)) for _, error in self.refusals)

    def to_bytes(self) -> bytes:
        refusals = [
            [name, type(error).__name__, _unprefixed(error), error.part, error.feature] for name, error in self.refusals
        ]
        return json.dumps({"engines": list(self.engines), "refusals": refusals}).encode("utf-8")

    @classmethod
    def from_bytes(cls, spec: GrammarSpec, data: bytes) -> EngineChoice | None:
        """The choice `to_bytes` wrote, or None for bytes it did not write."""
        try:
            document = json.loads(data)
            engines = tuple(str(name) for name in document["engines"])
            refusals = tuple(
                (str(name), error_class(class_name)(message, part=part, feature=feature))
                for name, class_name, message, part, feature in document["refusals"]
            )
        except (ValueError, KeyError, TypeError):
            return None
        return cls(spec, engines, refusals) if engines else None


class EngineChecks(GuidedBackend):
    """The `CHECKS` pseudo-engine of `backend`: its compile of a spec runs the backend's admission
    checks and returns the `EngineChoice`, or raises the refusal naming what each engine cannot
    enforce (auto: "no backend can enforce this constraint faithfully (xgrammar: ...; llguidance:
    ...)"). A compile worker runs it before any engine compiles the spec (its own `check` is empty:
    the checks are the compile), so the checks never run on the thread that adds a request, a
    runaway one is killed at the compile budget, and the serving process's GIL is not held."""

    name = CHECKS

    def __init__(self, backend: GuidedBackend):
        super().__init__(
            backend.tokenizer,
            vocab_size=backend.vocab_size,
            config=backend.config,
            stop_token_ids=backend.stop_token_ids,
        )
        self.backend = backend

    @classmethod
    def check(cls, spec: GrammarSpec) -> None:
        """Nothing: the checks are this engine's compile."""

    def compile(self, spec: GrammarSpec) -> EngineChoice:
        # Admission's deferred schema checks first (a no-op where they ran): their refusal is
        # admission's own, not wrapped in each engine's.
        finish_deferred_checks(spec)
        engines = compile_engines(self.backend, spec)
        return EngineChoice(spec, engines, tuple(static_refusals(self.backend, spec)))

    def compile_checked(self, spec: GrammarSpec) -> EngineChoice:
        return self.compile(spec)  # a choice has no language to find empty

    def new_grammar(self, compiled: CompiledGrammar) -> Grammar:
        raise TypeError("an engine choice is not a grammar")

    def serialize(self, compiled: CompiledGrammar) -> bytes | None:
        return compiled.to_bytes() if isinstance(compiled, EngineChoice) else None

    def deserialize(self, spec: GrammarSpec, data: bytes) -> EngineChoice | None:
        return EngineChoice.from_bytes(spec, data)


def engine_checks(backend: GuidedBackend) -> EngineChecks:
    """`backend`'s `EngineChecks`, made once per backend object."""
    checks = vars(backend).get("_engine_checks")
    if checks is None:
        checks = backend._engine_checks = EngineChecks(backend)  # type: ignore[attr-defined]
    return checks


def _unprefixed(error: InvalidGrammarError) -> str:
    """The message `InvalidGrammarError(message, part=...)` was built with (str() prefixes the part)."""
    text = str(error)
    prefix = f"{error.part}: " if error.part else ""
    return text[len(prefix) :] if prefix and text.startswith(prefix) else text
