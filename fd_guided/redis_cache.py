"""A Redis L2 cache of compiled grammars, shared by every process of a deployment.

`CompileService` asks it after an in-process miss and fills it after a compile, so a prefill
and a decode instance (or the TP ranks of one instance, or a restarted server) compile each
spec once. The value is the backend's `serialize` bytes; the backend's `deserialize` refuses
bytes from another version or tokenizer, and the key already separates those cases:

    key = prefix + sha256(backend name, serialization version, tokenizer identity
                          (name, token bytes digest, tokenizer and logits vocab sizes, stop ids),
                          spec kind, spec source, JSON format)

Never raises on a miss, an oversized value or an unreachable server: it logs (rate-limited)
and the caller compiles. Needs the ``redis`` extra (``pip install fd-guided[redis]``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import threading
import time
import weakref

from .interface import GuidedBackend
from .spec import GrammarSpec

logger = logging.getLogger(__name__)

DEFAULT_PREFIX = "fd_guided:grammar:"
DEFAULT_TTL_S = 24 * 3600
# A compiled grammar for a 150k vocabulary is usually well under 10 MiB; bigger values cost more
# to ship than to recompile.
DEFAULT_MAX_VALUE_BYTES = 64 * 1024 * 1024
_WARN_INTERVAL_S = 60.0


class RedisGrammarCache:
    """`SharedGrammarCache` on a Redis server (see `fd_guided.compile.SharedGrammarCache`).

    Args:
        client: a ``redis.Redis`` client (bytes responses); see `from_url` to build one with
            short timeouts, so an unreachable server costs a step little.
        ttl_s: seconds an entry lives (refreshed by every put); None keeps entries forever.
        max_value_bytes: larger serialized grammars are not stored.
        prefix: key namespace, e.g. one per deployment.
    """

    def __init__(
        self,
        client,
        *,
        ttl_s: float | None = DEFAULT_TTL_S,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        prefix: str = DEFAULT_PREFIX,
    ):
        if ttl_s is not None and ttl_s <= 0:
            raise ValueError("ttl_s must be positive or None")
        if max_value_bytes <= 0:
            raise ValueError("max_value_bytes must be positive")
        self.client = client
        self.ttl_s = ttl_s
        self.max_value_bytes = max_value_bytes
        self.prefix = prefix
        self._identities: weakref.WeakKeyDictionary[GuidedBackend, str] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._last_warning = 0.0

    @classmethod
    def from_url(cls, url: str, *, socket_timeout_s: float = 0.5, **kwargs) -> RedisGrammarCache:
        """A cache on ``redis://host:port/db`` with connect and read timeouts of `socket_timeout_s`."""
        import redis

        client = redis.Redis.from_url(url, socket_timeout=socket_timeout_s, socket_connect_timeout=socket_timeout_s)
        return cls(client, **kwargs)

    def key(self, spec: GrammarSpec, backend: GuidedBackend) -> str:
        """The Redis key of `spec` compiled by `backend` (stable across processes and hosts)."""
        fmt = dataclasses.asdict(spec.json_format) if spec.json_format is not None else None
        material = json.dumps(
            [self._backend_identity(backend), spec.kind, spec.source, fmt], sort_keys=True, default=list
        )
        return self.prefix + hashlib.sha256(material.encode("utf-8")).hexdigest()

    def get(self, spec: GrammarSpec, backend: GuidedBackend) -> bytes | None:
        try:
            return self.client.get(self.key(spec, backend))
        except Exception as error:  # redis.RedisError, OSError: the caller compiles instead
            self._warn("get", error)
            return None

    def put(self, spec: GrammarSpec, backend: GuidedBackend, data: bytes) -> None:
        if len(data) > self.max_value_bytes:
            logger.info(
                "compiled %s is %d bytes, over max_value_bytes=%d: not shared",
                spec.describe(),
                len(data),
                self.max_value_bytes,
            )
            return
        try:
            self.client.set(self.key(spec, backend), data, ex=int(self.ttl_s) if self.ttl_s else None)
        except Exception as error:
            self._warn("put", error)

    def _backend_identity(self, backend: GuidedBackend) -> str:
        with self._lock:
            identity = self._identities.get(backend)
        if identity is None:
            identity = backend_identity(backend)
            with self._lock:
                self._identities[backend] = identity
        return identity

    def _warn(self, operation: str, error: Exception) -> None:
        now = time.monotonic()
        if now - self._last_warning >= _WARN_INTERVAL_S:
            self._last_warning = now
            logger.warning(
                "shared grammar cache %s failed (compiling locally): %s: %s", operation, type(error).__name__, error
            )


def backend_identity(backend: GuidedBackend) -> str:
    """A digest of everything besides the spec that a compiled grammar depends on."""
    tokenizer = backend.tokenizer
    tokens = hashlib.sha256()
    for token in tokenizer.token_bytes:
        tokens.update(b"\xff" if token is None else len(token).to_bytes(2, "little") + token)
    stop_ids = list(getattr(backend, "stop_token_ids", tokenizer.eos_token_ids))
    material = [
        backend.name,
        serialization_version(backend),
        tokenizer.name,
        tokens.hexdigest(),
        tokenizer.vocab_size,
        backend.vocab_size,
        sorted(int(i) for i in stop_ids),
    ]
    return hashlib.sha256(json.dumps(material).encode("utf-8")).hexdigest()


def serialization_version(backend: GuidedBackend) -> str:
    """The version of the backend's serialized format (a backend may set `serialization_version`)."""
    version = getattr(backend, "serialization_version", None)
    if version is not None:
        return str(version)
    if backend.name == "xgrammar":
        import xgrammar

        return f"xgrammar:{xgrammar.get_serialization_version()}"
    return f"{type(backend).__module__}.{type(backend).__qualname__}"


__all__ = ["RedisGrammarCache", "backend_identity", "serialization_version"]
