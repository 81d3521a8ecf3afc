"""fd_guided: guided decoding (structured output) for Paddle-based LLM serving stacks.

Public API re-exports only; see docs/architecture.md for the map.
"""

from .config import GuidedConfig
from .errors import (
    BackendNotFoundError,
    DuplicateBackendError,
    GrammarCompileTimeout,
    GuidedDecodingError,
    GuidedRequestError,
    InvalidGrammarError,
    SlotStateError,
)
from .manager import DraftTree, GuidedDecodingManager, GuidedFinish, JumpForward
from .metrics import GuidedMetrics
from .reasoning import ReasoningMarker, marker_from_text
from .registry import available_backends, create_backend, get_backend_class, register_backend
from .spec import GrammarSpec, JsonFormat, parse_guided_request
from .tokenizer import TokenizerBundle, load_tokenizer

__version__ = "0.1.0"

__all__ = [
    "BackendNotFoundError",
    "DraftTree",
    "DuplicateBackendError",
    "GrammarCompileTimeout",
    "GrammarSpec",
    "GuidedConfig",
    "GuidedDecodingError",
    "GuidedDecodingManager",
    "GuidedFinish",
    "GuidedMetrics",
    "GuidedRequestError",
    "InvalidGrammarError",
    "JsonFormat",
    "JumpForward",
    "ReasoningMarker",
    "SlotStateError",
    "TokenizerBundle",
    "available_backends",
    "create_backend",
    "get_backend_class",
    "load_tokenizer",
    "marker_from_text",
    "parse_guided_request",
    "register_backend",
]
