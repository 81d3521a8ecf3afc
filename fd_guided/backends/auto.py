"""The ``auto`` backend: xgrammar when it enforces the whole constraint, llguidance when it cannot.

The choice is a pure function of the spec (`choose_backend`), made at admission by `check` and
again, identically, by `compile`, so the compile cache keyed by spec stays valid and one
request's fallback never changes another's engine. xgrammar is preferred: its compiled masks
are fastest per step on long generations. llguidance takes over only when xgrammar refuses a
*feature* (a keyword it would ignore, a format it lacks, a schema it cannot build), never for a
syntax error, which is reported as xgrammar reports it. When both refuse, the error names what
each could not enforce.
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Sequence

from ..config import GuidedConfig
from ..errors import InvalidGrammarError
from ..interface import CompiledGrammar, Grammar, GuidedBackend
from ..spec import GrammarSpec
from ..tokenizer import TokenizerBundle
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


@functools.lru_cache(maxsize=4096)
def choose_backend(spec: GrammarSpec) -> str:
    """``"xgrammar"`` or ``"llguidance"`` for `spec`; raises InvalidGrammarError if neither can enforce it.

    Memoised: a pure function of the (frozen) spec, so admission and compile agree and repeated
    schemas cost one check.
    """
    try:
        XGrammarBackend.check(spec)
        if not _prefer_complete_fallback(spec):
            return PREFERRED
        return FALLBACK
    except InvalidGrammarError as refused:
        first = refused
    # A schema already passed the JSON-Schema meta-schema check, so xgrammar refusing it is a
    # limit of xgrammar; for regexes and grammars only an explicit feature refusal is.
    is_limit = first.feature is not None or spec.kind == "json_schema"
    fallback = _fallback_class()
    if not is_limit or fallback is None:
        raise first
    try:
        fallback.check(spec)
        return FALLBACK
    except InvalidGrammarError as second:
        features = [f"xgrammar: {first.feature or _reason(first)}", f"llguidance: {second.feature or _reason(second)}"]
        raise InvalidGrammarError(
            "no backend can enforce this constraint faithfully (" + "; ".join(features) + ")",
            part=second.part if second.feature and not first.feature else first.part,
            feature=" / ".join(f for f in (first.feature, second.feature) if f) or None,
        ) from None


def _prefer_complete_fallback(spec: GrammarSpec) -> bool:
    """xgrammar admits only a sound subset of the schema's values (alternatives it cannot express
    left out, or bounded strings without escapes: `fd_guided.schema.narrows`) while llguidance
    enforces all of it."""
    if spec.kind != "json_schema" or _fallback_class() is None:
        return False
    from ..schema import narrows

    if not narrows(PREFERRED, spec.schema, spec.json_format):
        return False
    try:
        _fallback_class().check(spec)
        return not narrows(FALLBACK, spec.schema, spec.json_format)
    except InvalidGrammarError:
        return False


def _reason(error: InvalidGrammarError) -> str:
    text = str(error)
    return text.split(": ", 1)[1] if error.part and text.startswith(f"{error.part}: ") else text


class AutoBackend(GuidedBackend):
    """Per-request choice between an xgrammar and an llguidance backend over one tokenizer.

    Both sub-backends are built from the same tokenizer, logits width, config and stop tokens;
    they share no mutable state. Compiled grammars keep their engine's type and `backend_name`,
    so `new_grammar` and `fill_bitmasks` dispatch on it.
    """

    name = "auto"

    def __init__(
        self,
        tokenizer: TokenizerBundle,
        *,
        vocab_size: int,
        config: GuidedConfig | None = None,
        stop_token_ids: Sequence[int] | None = None,
    ):
        super().__init__(tokenizer, vocab_size=vocab_size, config=config, stop_token_ids=stop_token_ids)
        self.backends: dict[str, GuidedBackend] = {
            PREFERRED: XGrammarBackend(tokenizer, vocab_size=vocab_size, config=self.config, stop_token_ids=self.stop_token_ids)
        }
        fallback = _fallback_class()
        if fallback is not None:
            self.backends[FALLBACK] = fallback(tokenizer, vocab_size=vocab_size, config=self.config, stop_token_ids=self.stop_token_ids)
        else:
            logger.warning("llguidance is not installed: the auto backend uses xgrammar only")

    @classmethod
    def check(cls, spec: GrammarSpec) -> None:
        choose_backend(spec)

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        name = choose_backend(spec)
        logger.info("auto backend: %s compiles %s", name, spec.describe())
        if self.metrics is not None:
            self.metrics.inc_labelled("auto_choice_total", "backend", name)
        return self.backends[name].compile(spec)

    def new_grammar(self, compiled: CompiledGrammar) -> Grammar:
        return self._owner(compiled).new_grammar(compiled)

    def fill_bitmasks(self, grammars: Sequence[Grammar], bitmask, rows: Sequence[int]) -> None:
        groups: dict[str, tuple[list[Grammar], list[int]]] = {}
        for grammar, row in zip(grammars, rows):
            name = PREFERRED if isinstance(grammar, XGrammarMatcher) else FALLBACK
            group = groups.setdefault(name, ([], []))
            group[0].append(grammar)
            group[1].append(row)
        for name, (members, member_rows) in groups.items():
            self.backends[name].fill_bitmasks(members, bitmask, member_rows)

    def serialize(self, compiled: CompiledGrammar) -> bytes | None:
        data = self._owner(compiled).serialize(compiled)
        return None if data is None else compiled.backend_name.encode("ascii") + _SERIAL_SEPARATOR + data

    def deserialize(self, spec: GrammarSpec, data: bytes) -> CompiledGrammar | None:
        name, _, payload = data.partition(_SERIAL_SEPARATOR)
        backend = self.backends.get(name.decode("ascii", errors="replace"))
        if backend is None or name.decode("ascii", errors="replace") != _safe_choice(spec):
            return None  # written by another choice rule or without llguidance: compile instead
        return backend.deserialize(spec, payload)

    def cache_stats(self) -> dict[str, Any]:
        return {f"{name}_{key}": value for name, backend in self.backends.items() for key, value in backend.cache_stats().items()}

    def close(self) -> None:
        for backend in self.backends.values():
            backend.close()

    def _owner(self, compiled: CompiledGrammar) -> GuidedBackend:
        backend = self.backends.get(compiled.backend_name)
        if backend is None:
            raise TypeError(f"auto cannot run a grammar compiled by {compiled.backend_name!r}")
        return backend


def _safe_choice(spec: GrammarSpec) -> str | None:
    try:
        return choose_backend(spec)
    except InvalidGrammarError:
        return None
