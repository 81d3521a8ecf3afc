"""The ``auto`` backend: xgrammar when it enforces the whole constraint, llguidance when it cannot.

At admission `compile_engines` (pure Python) names the engines whose checks pass, xgrammar first;
when neither can enforce the constraint the error names what each could not. The choice is
remembered per spec (`CHOICES`), so the compile service does not run the checks again for a spec
admission already decided (it runs them in a compile worker otherwise). The compile service
then compiles with those engines (`fd_guided.compile.service`): a request whose xgrammar compile
fails, crashes or runs out of budget is served by llguidance (compile-time fallback), and with
``GuidedConfig.auto_first_ready`` an uncached request starts on whichever engine is ready first
while xgrammar compiles for the cache. xgrammar is preferred once compiled: its masks are fastest
per step on long generations.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..admission.cache import VerdictCache
from ..config import GuidedConfig
from ..errors import InvalidGrammarError, combine_engine_errors
from ..interface import CompiledGrammar, Grammar, GuidedBackend
from ..spec import GrammarSpec
from ..tokenizer import TokenizerBundle
from ..unique_guard import unguarded
from . import composite
from .composite import CompositeBackend, EngineChoice
from .xgrammar import XGrammarBackend, XGrammarMatcher

logger = logging.getLogger(__name__)

PREFERRED = "xgrammar"
FALLBACK = "llguidance"
_SERIAL_SEPARATOR = b"\n"


def _fallback_class():
    """The llguidance backend class, or None when llguidance is not installed (auto = xgrammar)."""
    try:
        from .llguidance import LLGuidanceBackend
    except ImportError:
        return None
    return LLGuidanceBackend


# Each spec's choice once worked out in this process (by `AutoBackend.check` at admission, or by
# a compile): the compile service takes a spec's engines from here instead of running the checks
# again in a worker (`CompositeBackend.remembered_choice`). Bounded by entries and key bytes.
CHOICES = VerdictCache()


def candidate_engines(spec: GrammarSpec) -> tuple[str, ...]:
    """The engines whose admission checks pass for `spec`, xgrammar first.

    Raises InvalidGrammarError naming what each engine cannot enforce when none can. A spec
    xgrammar refuses for a syntax error (no `feature`) is not offered to llguidance unless it is a
    JSON schema (those already passed the meta-schema check, so a refusal is a limit of xgrammar).
    """
    return engine_choice(spec).engines


def engine_choice(spec: GrammarSpec) -> EngineChoice:
    """`candidate_engines` with what each other engine's check refused, remembered (`CHOICES`)."""
    return CHOICES.verdict(spec, len(spec.source), lambda: _choose(spec))


def remembered_choice(spec: GrammarSpec) -> EngineChoice | InvalidGrammarError | None:
    """`engine_choice(spec)` if this process worked it out before (a lookup, never the checks):
    the choice, or the refusal; None when it is not remembered."""
    if not CHOICES.known(spec):
        return None
    try:
        return CHOICES.verdict(spec, len(spec.source), _forgotten)
    except InvalidGrammarError as refused:
        return refused
    except LookupError:  # evicted since `known`
        return None


def _forgotten() -> EngineChoice:
    raise LookupError("no remembered choice")


def _choose(spec: GrammarSpec) -> EngineChoice:
    engines: list[str] = []
    refusals: list[tuple[str, InvalidGrammarError]] = []
    try:
        XGrammarBackend.check(spec)
        engines.append(PREFERRED)
        first = None
    except InvalidGrammarError as refused:
        first = refused
        refusals.append((PREFERRED, refused))
    fallback = _fallback_class()
    if fallback is None or (first is not None and first.feature is None and spec.kind != "json_schema"):
        if first is not None:
            raise first
        return EngineChoice(spec, tuple(engines))
    try:
        fallback.check(spec)
        engines.append(FALLBACK)
    except InvalidGrammarError as second:
        if first is None:
            return EngineChoice(spec, tuple(engines), ((FALLBACK, second),))
        features = [f"xgrammar: {first.feature or _reason(first)}", f"llguidance: {second.feature or _reason(second)}"]
        raise InvalidGrammarError(
            "no backend can enforce this constraint faithfully (" + "; ".join(features) + ")",
            part=second.part if second.feature and not first.feature else first.part,
            feature=" / ".join(f for f in (first.feature, second.feature) if f) or None,
        ) from None
    if len(engines) == 2 and _xgrammar_narrows(spec):
        engines.reverse()  # llguidance enforces all of it, xgrammar only a sound subset
    return EngineChoice(spec, tuple(engines), tuple(refusals))


def static_refusals(spec: GrammarSpec) -> list[tuple[str, InvalidGrammarError]]:
    """What each engine's admission check refuses in `spec` (for the error when every compile fails)."""
    known = remembered_choice(spec)
    if isinstance(known, EngineChoice):
        return list(known.refusals)
    refusals = []
    for name, backend_class in ((PREFERRED, XGrammarBackend), (FALLBACK, _fallback_class())):
        if backend_class is None:
            continue
        try:
            backend_class.check(spec)
        except InvalidGrammarError as refused:
            refusals.append((name, refused))
    return refusals


def choose_backend(spec: GrammarSpec) -> str:
    """The engine auto prefers for `spec` at admission (compile-time fallback may still change it)."""
    return candidate_engines(spec)[0]


def _xgrammar_narrows(spec: GrammarSpec) -> bool:
    """xgrammar admits only a sound subset of the schema's values (alternatives it cannot express
    left out, or bounded strings without escapes: `fd_guided.schema.narrows`) while llguidance,
    whose check passed, enforces all of it."""
    if spec.kind != "json_schema":
        return False
    from ..schema import narrows

    return narrows(PREFERRED, spec.schema, spec.json_format, unique_guard=True) and not narrows(
        FALLBACK, spec.schema, spec.json_format, unique_guard=True
    )


def _reason(error: InvalidGrammarError) -> str:
    text = str(error)
    return text.split(": ", 1)[1] if error.part and text.startswith(f"{error.part}: ") else text


class MaskCosts:
    """Per engine, measured on this backend's own fills: seconds per bitmask row (an exponential
    average over fill calls) and rows per request (rows filled / matchers created). Their product's
    difference between two engines is what one saves a request over the other: how long a request
    that one engine could serve now should wait for the other's compile (`expected_gain_s`).

    Updated from the fill thread and read from compile-service threads; a lock keeps each update
    whole. A guess is never made: until each engine has filled `MIN_ROWS` rows the gain is 0.
    """

    MIN_ROWS = 64
    SMOOTHING = 0.05  # weight of one fill call in the average

    def __init__(self):
        self._lock = threading.Lock()
        self.row_seconds: dict[str, float] = {}
        self.rows: dict[str, int] = {}
        self.grammars: dict[str, int] = {}

    def grammar_created(self, engine: str) -> None:
        with self._lock:
            self.grammars[engine] = self.grammars.get(engine, 0) + 1

    def filled(self, engine: str, rows: int, seconds: float) -> None:
        if rows <= 0:
            return
        with self._lock:
            per_row = seconds / rows
            previous = self.row_seconds.get(engine)
            self.row_seconds[engine] = per_row if previous is None else previous + self.SMOOTHING * (per_row - previous)
            self.rows[engine] = self.rows.get(engine, 0) + rows

    def gain_s(self, engine: str, over: str) -> float:
        with self._lock:
            if min(self.rows.get(engine, 0), self.rows.get(over, 0)) < self.MIN_ROWS:
                return 0.0
            rows = self.rows[engine] + self.rows[over]
            per_request = rows / max(1, self.grammars.get(engine, 0) + self.grammars.get(over, 0))
            return max(0.0, (self.row_seconds[over] - self.row_seconds[engine]) * per_request)


class AutoBackend(CompositeBackend):
    """Per-request choice between an xgrammar and an llguidance backend over one tokenizer.

    Both sub-backends are built from the same tokenizer, logits width, config and stop tokens;
    they share no mutable state. Compiled grammars keep their engine's type and `backend_name`,
    so `new_grammar` and `fill_bitmasks` dispatch on it. `engines` passes sub-backends already
    built (a clone with another config, a worker process's rebuild): each must be built with this
    backend's tokenizer, logits width, config and stop tokens.
    """

    name = "auto"

    def __init__(
        self,
        tokenizer: TokenizerBundle,
        *,
        vocab_size: int,
        config: GuidedConfig | None = None,
        stop_token_ids: Sequence[int] | None = None,
        engines: Mapping[str, GuidedBackend] | None = None,
    ):
        super().__init__(tokenizer, vocab_size=vocab_size, config=config, stop_token_ids=stop_token_ids)
        self.mask_costs = MaskCosts()
        if engines is not None:
            if PREFERRED not in engines or not set(engines) <= {PREFERRED, FALLBACK}:
                raise ValueError(f"auto's engines are {PREFERRED!r} and optionally {FALLBACK!r}, got {sorted(engines)}")
            self.backends: dict[str, GuidedBackend] = {
                name: engines[name] for name in (PREFERRED, FALLBACK) if name in engines
            }
            return
        self.backends = {
            PREFERRED: XGrammarBackend(
                tokenizer, vocab_size=vocab_size, config=self.config, stop_token_ids=self.stop_token_ids
            )
        }
        fallback = _fallback_class()
        if fallback is not None:
            self.backends[FALLBACK] = fallback(
                tokenizer, vocab_size=vocab_size, config=self.config, stop_token_ids=self.stop_token_ids
            )
        else:
            logger.warning("llguidance is not installed: the auto backend uses xgrammar only")

    @classmethod
    def check(cls, spec: GrammarSpec) -> None:
        engine_choice(spec)  # remembered: the compile service reuses it (`remembered_choice`)

    @classmethod
    def compile_engines(cls, spec: GrammarSpec) -> tuple[str, ...]:
        return candidate_engines(spec)

    @classmethod
    def remembered_choice(cls, spec: GrammarSpec) -> EngineChoice | InvalidGrammarError | None:
        return remembered_choice(spec)

    @property
    def engine_names(self) -> tuple[str, ...]:
        return tuple(self.backends)

    def engine(self, name: str) -> GuidedBackend:
        return self.backends[name]

    def warm_up(self) -> None:
        for backend in self.backends.values():
            backend.warm_up()

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """In-process compile (tools, thread isolation): each candidate engine in turn."""
        return self._first_engine(spec, lambda backend: backend.compile(spec))

    def compile_checked(self, spec: GrammarSpec) -> CompiledGrammar:
        return self._first_engine(spec, lambda backend: backend.compile_checked(spec))

    def _first_engine(self, spec: GrammarSpec, run) -> CompiledGrammar:
        failures: list[tuple[str, BaseException]] = []
        for name in candidate_engines(spec):
            try:
                return run(self.backends[name])
            except InvalidGrammarError as error:
                failures.append((name, error))
        raise combine_engine_errors(self.static_refusals(spec) + failures)

    @classmethod
    def static_refusals(cls, spec: GrammarSpec) -> list[tuple[str, InvalidGrammarError]]:
        return static_refusals(spec)

    def worker_recipe(self) -> tuple[str, dict]:
        """`ProcessCompilable`: the shared constructor arguments once, and per engine its own
        recipe's factory with the arguments only that engine takes (xgrammar's TokenizerInfo)."""
        common = {
            "tokenizer": self.tokenizer.portable(),
            "vocab_size": self.vocab_size,
            "config": self.config,
            "stop_token_ids": self.stop_token_ids,
        }
        engines = {}
        for name, backend in self.backends.items():
            recipe = composite.worker_recipe(backend)
            if recipe is None:
                raise TypeError(f"auto's {name} engine cannot be rebuilt in a worker process")
            path, kwargs = recipe
            engines[name] = (path, {key: value for key, value in kwargs.items() if key not in common})
        return "fd_guided.backends.auto:backend_from_recipe", {**common, "engines": engines}

    def with_config(self, config: GuidedConfig) -> AutoBackend:
        if config == self.config:
            return self
        return AutoBackend(
            self.tokenizer,
            vocab_size=self.vocab_size,
            config=config,
            stop_token_ids=self.stop_token_ids,
            engines={name: composite.with_config(backend, config) for name, backend in self.backends.items()},
        )

    def new_grammar(self, compiled: CompiledGrammar) -> Grammar:
        grammar = self._owner(compiled).new_grammar(compiled)
        self.mask_costs.grammar_created(compiled.backend_name)
        return grammar

    def fill_bitmasks(self, grammars: Sequence[Grammar], bitmask, rows: Sequence[int]) -> None:
        groups: dict[str, tuple[list[Grammar], list[int]]] = {}
        for grammar, row in zip(grammars, rows):
            name = PREFERRED if isinstance(unguarded(grammar), XGrammarMatcher) else FALLBACK
            group = groups.setdefault(name, ([], []))
            group[0].append(grammar)
            group[1].append(row)
        for name, (members, member_rows) in groups.items():
            started = time.perf_counter()
            self.backends[name].fill_bitmasks(members, bitmask, member_rows)
            self.mask_costs.filled(name, len(member_rows), time.perf_counter() - started)

    def expected_gain_s(self, engine: str, over: str) -> float:
        """What running on `engine` instead of `over` saves a request, from this backend's own
        fills (`MaskCosts`): 0 until both engines have filled enough rows to tell. llguidance is
        preferred over xgrammar only where xgrammar would enforce a narrower language
        (`candidate_engines`): that preference is for the constraint, not for speed, so it is
        worth the whole wait the config allows (`auto_fallback_grace_s`)."""
        if engine == FALLBACK and over == PREFERRED:
            return float("inf")
        return self.mask_costs.gain_s(engine, over)

    def serialize(self, compiled: CompiledGrammar) -> bytes | None:
        data = self._owner(compiled).serialize(compiled)
        return None if data is None else compiled.backend_name.encode("ascii") + _SERIAL_SEPARATOR + data

    def deserialize(self, spec: GrammarSpec, data: bytes) -> CompiledGrammar | None:
        name, _, payload = data.partition(_SERIAL_SEPARATOR)
        backend = self.backends.get(name.decode("ascii", errors="replace"))
        if backend is None:
            return None  # written by an engine this process lacks: compile instead
        return backend.deserialize(spec, payload)

    def cache_stats(self) -> dict[str, Any]:
        return {
            f"{name}_{key}": value
            for name, backend in self.backends.items()
            for key, value in backend.cache_stats().items()
        }

    def close(self) -> None:
        for backend in self.backends.values():
            backend.close()

    def _owner(self, compiled: CompiledGrammar) -> GuidedBackend:
        backend = self.backends.get(compiled.backend_name)
        if backend is None:
            raise TypeError(f"auto cannot run a grammar compiled by {compiled.backend_name!r}")
        return backend


def backend_from_recipe(*, engines: Mapping[str, tuple[str, dict]], **common) -> AutoBackend:
    """`AutoBackend.worker_recipe`'s factory: each engine from its own factory, then auto over them."""
    built = {name: composite.from_recipe((path, {**common, **own})) for name, (path, own) in engines.items()}
    return AutoBackend(
        common["tokenizer"],
        vocab_size=common["vocab_size"],
        config=common["config"],
        stop_token_ids=common["stop_token_ids"],
        engines=built,
    )
