"""The JSON-Schema-Test-Suite at string level, through any registered backend's `Grammar` interface.

For every test case the backend is asked to admit (``parse_guided_request``) and compile the
case's schema once; each instance is then written as compact JSON and fed **token by token** to
a fresh matcher (`Grammar.accept_token`, then a stop token, then `Grammar.is_terminated`). An
instance is *accepted* when some order of its object keys is accepted (engines fix the order of
declared properties; the search backtracks with `Grammar.rollback`), and *rejected* when no order
is. Per backend and draft this gives:

  - coverage: schemas admitted and compiled / all schemas;
  - soundness: invalid instances rejected / invalid instances of compiled schemas (must be 1);
  - completeness: valid instances accepted / valid instances of compiled schemas.

Nothing here knows an engine: a third-party backend runs the kit by its registered name
(``run_suite("mybackend", "draft2020-12")``, or tests/backends/test_json_schema_suite.py, which is
parametrised over `fd_guided.registry.available_backends`). Matchers are built over a byte-level
tokenizer (256 byte tokens and a stop token), so compiles take milliseconds and every byte is a
token boundary.

The suite is read from ``$FD_GUIDED_JSON_SCHEMA_SUITE`` or ``../shared/corpora/json-schema-test-suite``
next to the repository (the directory holding ``tests/draft2020-12``). Draft-7 cases without
``$schema`` get draft 7's, as the suite intends (a schema without one is read as 2020-12).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fd_guided.config import GuidedConfig
from fd_guided.errors import InvalidGrammarError
from fd_guided.spec import parse_guided_request
from fd_guided.tokenizer import TokenizerBundle

SUITE_ENV = "FD_GUIDED_JSON_SCHEMA_SUITE"
DRAFTS = {
    "draft2020-12": "https://json-schema.org/draft/2020-12/schema",
    "draft7": "http://json-schema.org/draft-07/schema#",
}
STOP = 256
SEARCH_BUDGET = 20_000  # token feeds per instance while searching key orders


def suite_root(repo_root: str | os.PathLike | None = None) -> Path | None:
    """The suite directory, from the environment or next to the repository; None if absent."""
    candidates = [os.environ.get(SUITE_ENV)]
    base = (
        Path(repo_root) if repo_root is not None else Path(__file__).resolve().parents[2]
    )  # fd_guided/harness/ -> the repo root
    candidates.append(str(base.parent / "shared" / "corpora" / "json-schema-test-suite"))
    for candidate in candidates:
        if candidate and (Path(candidate) / "tests" / "draft2020-12").is_dir():
            return Path(candidate)
    return None


@dataclass
class Case:
    file: str
    description: str
    schema: Any
    tests: list[dict]


def load_cases(root: Path, draft: str, *, optional: str | None = None) -> list[Case]:
    """The cases of one draft: required ones, or those of ``optional/<optional>`` (e.g. ``format``)."""
    folder = root / "tests" / draft
    if optional:
        folder = folder / "optional" / optional
    cases = []
    for path in sorted(folder.glob("*.json")):
        for raw in json.loads(path.read_text(encoding="utf-8")):
            schema = raw["schema"]
            if isinstance(schema, dict) and "$schema" not in schema:
                schema = {"$schema": DRAFTS[draft], **schema}
            cases.append(
                Case(path.name if not optional else f"{optional}/{path.name}", raw["description"], schema, raw["tests"])
            )
    return cases


def byte_tokenizer() -> TokenizerBundle:
    """256 one-byte tokens and a stop token (id 256)."""
    tokens = tuple(bytes([i]) for i in range(256)) + (None,)
    return TokenizerBundle(
        name="bytes",
        token_bytes=tokens,
        eos_token_ids=(STOP,),
        encode=lambda text: list(text.encode("utf-8")),
        decode_bytes=lambda ids: b"".join(tokens[i] or b"" for i in ids),
    )


@dataclass
class SchemaResult:
    case: Case
    compiled: bool
    reason: str = ""
    seconds: float = 0.0
    valid: int = 0
    valid_accepted: int = 0
    invalid: int = 0
    invalid_rejected: int = 0
    unsound: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)
    capped: int = 0


def run_cases(
    backend_name: str, cases: list[Case], *, strict: bool = False, config: GuidedConfig | None = None
) -> list[SchemaResult]:
    """Admit, compile once and test every instance of every case on `backend_name`."""
    from fd_guided.registry import get_backend_class

    config = (config or GuidedConfig()).replace(backend=backend_name)
    tokenizer = byte_tokenizer()
    backend = get_backend_class(backend_name)(tokenizer, vocab_size=STOP + 1, config=config, stop_token_ids=[STOP])
    try:
        return [_run_case(backend, case, strict, config) for case in cases]
    finally:
        backend.close()


def _run_case(backend, case: Case, strict: bool, config: GuidedConfig) -> SchemaResult:
    # Default layout (bounded free whitespace): compact JSON, as the instances are written, is allowed.
    fields = {"guided_json": case.schema, "guided_strict": strict}
    start = time.perf_counter()
    try:
        spec = parse_guided_request(fields, config)
        compiled = backend.compile(spec)
    except InvalidGrammarError as error:
        return SchemaResult(case, False, error.feature or str(error), time.perf_counter() - start)
    result = SchemaResult(case, True, "", time.perf_counter() - start)
    for test in case.tests:
        accepted, capped = accepts(backend, compiled, test["data"])
        result.capped += capped
        if test["valid"]:
            result.valid += 1
            result.valid_accepted += accepted
            if not accepted:
                result.missed.append(test["description"])
        else:
            result.invalid += 1
            result.invalid_rejected += not accepted
            if accepted:
                result.unsound.append(test["description"])
    return result


def accepts(backend, compiled, value: Any) -> tuple[bool, bool]:
    """(some key order of `value` is accepted as a complete match, the order search ran out of budget)."""
    grammar = backend.new_grammar(compiled)
    budget = [SEARCH_BUDGET]
    try:
        for _ in _ways(grammar, value, budget):
            if grammar.accept_token(STOP) and grammar.is_terminated():
                return True, False
    except _Exhausted:
        return False, True
    return False, False


class _Exhausted(Exception):
    pass


def _feed(grammar, text: str, budget: list[int]) -> bool:
    data = text.encode("utf-8", errors="surrogatepass")
    budget[0] -= len(data)
    if budget[0] < 0:
        raise _Exhausted
    for count, byte in enumerate(data):
        if not grammar.accept_token(byte):
            if count:
                grammar.rollback(count)
            return False
    return True


def _text(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: only the escaped spelling is valid UTF-8
        text = json.dumps(value, separators=(",", ":"))
    return text


def _ways(grammar, value: Any, budget: list[int]) -> Iterator[None]:
    """Feed `value`; yield once per key order that the grammar accepts, rolling back in between."""
    if isinstance(value, dict) and value:
        if _feed(grammar, "{", budget):
            yield from _members(grammar, list(value.items()), True, budget)
            grammar.rollback(1)
    elif isinstance(value, list) and value:
        if _feed(grammar, "[", budget):
            yield from _items(grammar, value, 0, budget)
            grammar.rollback(1)
    else:
        text = _text(value)
        if _feed(grammar, text, budget):
            yield
            grammar.rollback(len(text.encode("utf-8")))


def _members(grammar, remaining: list, first: bool, budget: list[int]) -> Iterator[None]:
    if not remaining:
        if _feed(grammar, "}", budget):
            yield
            grammar.rollback(1)
        return
    for index, (key, item) in enumerate(remaining):
        head = ("" if first else ",") + _text(key) + ":"
        if not _feed(grammar, head, budget):
            continue
        rest = remaining[:index] + remaining[index + 1 :]
        for _ in _ways(grammar, item, budget):
            yield from _members(grammar, rest, False, budget)
        grammar.rollback(len(head.encode("utf-8")))


def _items(grammar, items: list, index: int, budget: list[int]) -> Iterator[None]:
    if index == len(items):
        if _feed(grammar, "]", budget):
            yield
            grammar.rollback(1)
        return
    separator = "," if index else ""
    if separator and not _feed(grammar, separator, budget):
        return
    for _ in _ways(grammar, items[index], budget):
        yield from _items(grammar, items, index + 1, budget)
    if separator:
        grammar.rollback(1)


def summarise(results: list[SchemaResult]) -> dict[str, Any]:
    """Coverage, completeness, soundness and admission+compile time percentiles."""
    compiled = [r for r in results if r.compiled]
    valid = sum(r.valid for r in compiled)
    invalid = sum(r.invalid for r in compiled)
    times = sorted(r.seconds for r in compiled)
    return {
        "schemas": len(results),
        "compiled": len(compiled),
        "coverage": len(compiled) / len(results) if results else 0.0,
        "valid": valid,
        "completeness": sum(r.valid_accepted for r in compiled) / valid if valid else 1.0,
        "invalid": invalid,
        "soundness": sum(r.invalid_rejected for r in compiled) / invalid if invalid else 1.0,
        "unsound": [(r.case.file, r.case.description, d) for r in compiled for d in r.unsound],
        "capped": sum(r.capped for r in compiled),
        "p50_ms": 1000 * statistics.median(times) if times else 0.0,
        "p99_ms": 1000 * times[min(len(times) - 1, int(0.99 * len(times)))] if times else 0.0,
    }


def run_suite(
    backend_name: str, draft: str, *, root: Path | None = None, optional: str | None = None, strict: bool = False
) -> dict[str, Any]:
    """`summarise` of one backend on one draft of the suite (raises FileNotFoundError without it)."""
    root = root or suite_root()
    if root is None:
        raise FileNotFoundError(f"JSON-Schema-Test-Suite not found: set {SUITE_ENV}")
    return summarise(run_cases(backend_name, load_cases(root, draft, optional=optional), strict=strict))
