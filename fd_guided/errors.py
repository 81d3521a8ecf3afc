"""The one error hierarchy of fd_guided.

A server maps `InvalidGrammarError` to HTTP 400 (it is a ValueError), `GrammarCompileTimeout` to a
per-request failure, and everything else deriving from `GuidedDecodingError` to a per-request 500.
None of these is ever raised for another request's fault.
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


class BackendNotFoundError(GuidedDecodingError, LookupError):
    """No backend is registered under the requested name."""


class DuplicateBackendError(GuidedDecodingError, ValueError):
    """Two backends were registered under one name."""


class GrammarCompileTimeout(GuidedDecodingError, TimeoutError):
    """A grammar did not finish compiling before the request needed its first mask."""


class GuidedRequestError(GuidedDecodingError):
    """A guided request failed while decoding (e.g. the sampler produced a token the grammar rejects)."""


class SlotStateError(GuidedDecodingError, RuntimeError):
    """The host called a hook out of order for a slot (e.g. accept on an empty slot)."""
