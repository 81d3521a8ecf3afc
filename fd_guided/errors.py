"""The one error hierarchy of fd_guided.

A server maps `InvalidGrammarError` to HTTP 400 (it is a ValueError). That includes the compile
budget errors (`GrammarCompileTimeout`, `GrammarCompileMemoryError`, a crashed compile): a
constraint too costly to compile within the engine's budget is the request's fault, and retrying it
unchanged fails the same way. Everything else deriving from `GuidedDecodingError` is a per-request
500. None of these is ever raised for another request's fault.
"""


class GuidedDecodingError(Exception):
    """Base class of every error fd_guided raises on purpose."""


class InvalidGrammarError(GuidedDecodingError, ValueError):
    """The request's constraint is malformed or cannot be enforced faithfully.

    `part` names the offending field or schema location (e.g. ``guided_json: $.properties.tags``)
    so the client can fix the request. `feature` is set when the constraint is well-formed but uses
    something the backend cannot enforce (e.g. ``uniqueItems``), None for syntax errors: the
    ``auto`` backend falls back to another engine only for the former.
    """

    def __init__(self, message: str, *, part: str | None = None, feature: str | None = None):
        self.part = part
        self.feature = feature
        super().__init__(f"{part}: {message}" if part else message)


class UnsatisfiableGrammarError(InvalidGrammarError):
    """The compiled constraint admits no output at all (its first step allows nothing, or only a stop
    where an empty output is not valid). Engines judge this by their own grammar, and one engine's
    grammar can be wrong (xgrammar finds ``exclusiveMinimum 0.1, maximum 0.1000001`` empty), so
    ``auto`` still tries its other engine; only when all agree is the request refused as such."""


class BackendNotFoundError(GuidedDecodingError, LookupError):
    """No backend is registered under the requested name."""


class DuplicateBackendError(GuidedDecodingError, ValueError):
    """Two backends were registered under one name."""


class CompileSkipped(GuidedDecodingError):
    """A cache-only compile (no request waited for it) was dropped from a full backlog. Not a
    request error: nothing is remembered, and a later request compiles the constraint again."""


class CompileBudgetError(InvalidGrammarError):
    """Compiling the constraint ran past a budget (time, memory) or crashed its compile worker.

    The worker was killed and replaced; the request fails, no other request is affected. `feature`
    names the budget, so the ``auto`` backend still tries its other engine.
    """

    def __init__(self, message: str, *, part: str | None = None, feature: str | None = "compile budget"):
        super().__init__(message, part=part, feature=feature)


class GrammarCompileTimeout(CompileBudgetError, TimeoutError):
    """A grammar did not compile within its time budget (`GuidedConfig.compile_timeout_s`)."""

    def __init__(self, message: str, *, part: str | None = None, feature: str | None = "compile time budget"):
        super().__init__(message, part=part, feature=feature)


class GrammarCompileMemoryError(CompileBudgetError):
    """A compile grew its worker past `GuidedConfig.compile_memory_limit_bytes`."""

    def __init__(self, message: str, *, part: str | None = None, feature: str | None = "compile memory budget"):
        super().__init__(message, part=part, feature=feature)


class GrammarCompileCrash(CompileBudgetError):
    """The native compiler died on this constraint (e.g. a segfault); its worker process was replaced."""

    def __init__(
        self, message: str, *, part: str | None = None, feature: str | None = "a constraint that crashes the compiler"
    ):
        super().__init__(message, part=part, feature=feature)


class GuidedRequestError(GuidedDecodingError):
    """A guided request failed while decoding (e.g. the sampler produced a token the grammar rejects)."""


class SlotStateError(GuidedDecodingError, RuntimeError):
    """The host called a hook out of order for a slot (e.g. accept on an empty slot)."""


def error_class(name: str) -> type[InvalidGrammarError]:
    """The `InvalidGrammarError` subclass called `name` (errors cross process boundaries by name)."""
    for cls in (
        InvalidGrammarError,
        UnsatisfiableGrammarError,
        CompileBudgetError,
        GrammarCompileTimeout,
        GrammarCompileMemoryError,
        GrammarCompileCrash,
    ):
        if cls.__name__ == name:
            return cls
    return InvalidGrammarError


def combine_engine_errors(failures: list[tuple[str, BaseException]]) -> BaseException:
    """One error for a constraint every engine failed on, naming each engine's reason.

    A single failure is returned as it is. When every engine failed the same way (all found it
    unsatisfiable, all ran out of budget) the combined error keeps that class.
    """
    if len(failures) == 1:
        return failures[0][1]
    message = (
        "no engine could compile this constraint ("
        + "; ".join(f"{engine}: {error}" for engine, error in failures)
        + ")"
    )
    first = failures[0][1]
    part = getattr(first, "part", None)
    feature = " / ".join(f for f in (getattr(e, "feature", None) for _, e in failures) if f) or None
    for common in (
        UnsatisfiableGrammarError,
        GrammarCompileTimeout,
        GrammarCompileMemoryError,
        GrammarCompileCrash,
        CompileBudgetError,
    ):
        if all(isinstance(error, common) for _, error in failures):
            return (
                common(message, part=part, feature=feature)
                if common is not UnsatisfiableGrammarError
                else common(message, part=part)
            )
    return InvalidGrammarError(message, part=part, feature=feature)
