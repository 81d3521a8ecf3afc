"""Engine-level settings of guided decoding, with the defaults a serving stack should start from."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Literal

REJECTION_POLICIES = ("error",)
DEFAULT_CACHE_BYTES = 512 * 1024 * 1024


def _default_threads() -> int:
    return max(1, (os.cpu_count() or 2) // 2)


def _default_compile_workers() -> int:
    # Several workers even on small machines: one slow grammar must not queue every other
    # request's compile behind it (compiles release the GIL; an idle worker costs nothing).
    return max(4, _default_threads())


@dataclass(frozen=True)
class GuidedConfig:
    """Settings shared by every request of one engine.

    `backend` ``auto`` (the default) compiles each request with xgrammar when xgrammar enforces
    it faithfully and with llguidance otherwise; ``xgrammar`` or ``llguidance`` pin one engine.

    Whitespace fields are the defaults a request may override (see `fd_guided.spec`).
    `max_whitespace_cnt` bounds every whitespace run so a model cannot loop on spaces until
    `max_tokens`; set it to None only together with `any_whitespace=False`.

    `strict_mode` (default True): a JSON object schema that declares properties admits no
    undeclared one and a tuple no extra item unless the schema says otherwise; False gives plain
    JSON Schema semantics (requests override it with ``guided_strict``). `unknown_formats`:
    ``"refuse"`` (default) refuses a string ``format`` no validator knows, ``"annotate"`` ignores
    it as JSON Schema validators do (``guided_unknown_formats``). `any_order`: object properties in
    any order where the engine supports it, i.e. xgrammar (``guided_any_order``).
    """

    backend: str = "auto"
    any_whitespace: bool = True
    max_whitespace_cnt: int | None = 2
    separators: tuple[str, str] | None = None
    strict_mode: bool = True
    unknown_formats: str = "refuse"
    any_order: bool = False
    compile_threads: int = dataclasses.field(default_factory=_default_threads)
    compile_workers: int = dataclasses.field(default_factory=_default_compile_workers)
    cache_limit_bytes: int = DEFAULT_CACHE_BYTES
    compile_timeout_s: float = 30.0
    fill_threads: int = dataclasses.field(default_factory=_default_threads)
    parallel_fill_min_rows: int = 16
    rejection_policy: Literal["error"] = "error"
    think_end_token: str | None = None

    def __post_init__(self):
        if self.rejection_policy not in REJECTION_POLICIES:
            raise ValueError(f"rejection_policy must be one of {REJECTION_POLICIES}, got {self.rejection_policy!r}")
        if self.cache_limit_bytes <= 0:
            raise ValueError("cache_limit_bytes must be positive: an unbounded compile cache is a memory DoS")
        for name in ("compile_threads", "compile_workers", "fill_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.compile_timeout_s <= 0:
            raise ValueError("compile_timeout_s must be positive")
        if self.max_whitespace_cnt is not None and self.max_whitespace_cnt < 1:
            raise ValueError("max_whitespace_cnt must be >= 1 or None")
        if self.unknown_formats not in ("refuse", "annotate"):
            raise ValueError(f"unknown_formats must be 'refuse' or 'annotate', got {self.unknown_formats!r}")

    def replace(self, **changes) -> "GuidedConfig":
        return dataclasses.replace(self, **changes)
