"""Engine-level settings of guided decoding, with the defaults a serving stack should start from."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Literal

from .limits import AdmissionLimits

REJECTION_POLICIES = ("error",)
COMPILE_ISOLATIONS = ("process", "thread")
DEFAULT_CACHE_BYTES = 512 * 1024 * 1024


def _default_threads() -> int:
    return max(1, (os.cpu_count() or 2) // 2)


# Admission's time on the caller's thread for the checks that are not bounded by construction
# (see `GuidedConfig.admission_budget_s`); FD_GUIDED_ADMISSION_BUDGET_MS overrides it for a
# process ("inline": every verdict at admission).
ADMISSION_BUDGET_ENV = "FD_GUIDED_ADMISSION_BUDGET_MS"
DEFAULT_ADMISSION_BUDGET_S = 0.002


def _default_admission_budget() -> float | None:
    value = os.environ.get(ADMISSION_BUDGET_ENV, "").strip().lower()
    if not value:
        return DEFAULT_ADMISSION_BUDGET_S
    if value in ("inline", "none", "off"):
        return None
    try:
        return max(0.0, float(value)) / 1e3
    except ValueError:
        raise ValueError(f"{ADMISSION_BUDGET_ENV}: milliseconds or 'inline', got {value!r}") from None


def _default_compile_workers() -> int:
    # Several workers even on small machines: one slow grammar must not queue every other
    # request's compile behind it. Workers are forked from one process that already holds the
    # tokenizer tables, so an idle one costs little memory.
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

    Compiles (see `fd_guided.compile`): with `compile_isolation` ``process`` (the default) every
    compile runs in a killable worker process: past `compile_timeout_s` seconds or
    `compile_memory_limit_bytes` of growth it is killed, its request fails with a
    `CompileBudgetError` (an `InvalidGrammarError`) and the worker is replaced; a native crash
    costs only that request. A grammar compiled there reaches this process as its serialized
    bytes, or, where those are estimated past `compile_transfer_max_bytes` (16 MiB) or would take
    more than twice the compile to send, by compiling it again here (xgrammar writes large
    grammars slowly and at ~11x their size in memory; see `fd_guided.compile.transfer`); None:
    always the bytes (no compile in this process). That second compile is not timed (the worker's
    was, and it repeats it): such a grammar can take up to about twice the budget to be ready.
    `compile_workers` compiles run at normal priority at once; one that
    runs longer than `compile_demote_after_s` drops to the lowest CPU priority and stops counting
    against that number, so a few slow compiles cannot hold back quick ones. Every compile runs at
    niceness `compile_nice` (10): background work, so a burst of cold compiles cannot starve the
    serving process's decode steps of CPU. ``thread`` compiles
    in this process (no kill, no crash isolation: for backends that cannot serialize grammars).
    `auto_first_ready`: ``auto`` compiles an uncached request with every engine at once; it runs on
    xgrammar if xgrammar is done within `auto_fallback_grace_s` of the start, else on the first
    engine ready (llguidance usually, in milliseconds) while xgrammar compiles for the cache.
    Such cache-only compiles (no request waits for them) are bounded: at most
    `max_background_compiles` wait at once, the oldest queued one is dropped beyond that, so a
    stream of distinct cold schemas cannot grow a backlog (or memory) without bound. With
    `background_idle_class` (default) they queue after every compile a request waits for, and they
    and the loading of their results run in the idle CPU class (Linux ``SCHED_IDLE``; niceness 19
    elsewhere): only on CPU nothing else wants, so they never delay the serving loop's wake-up.
    `limits` bound what may reach a native compiler at all (`fd_guided.limits`).

    A step never waits for a compile: hosts sample a guided request only once
    `GuidedDecodingManager.is_ready(slot)`. A row whose grammar is still compiling when the mask is
    applied waits at most `first_token_wait_s` (default 0), then its request finishes with reason
    ``error`` and its row allows only stop tokens; the rest of the batch goes on.

    `admission_budget_s` (default 2 ms; env ``FD_GUIDED_ADMISSION_BUDGET_MS``, ``inline`` for None):
    how long admission may spend on the caller's thread on the checks whose cost is not bounded
    by construction (a JSON schema's bounds, meta-schema and references, the backend's check).
    What has not finished then is decided in the compile worker, beside the compile; a refusal
    there fails that request alone, naming the feature and path, and is remembered, so the next
    identical request is refused at admission (`fd_guided.admission.deferred`). None: every
    verdict at admission, however long it takes (tools that compare verdicts need that).

    `jump_forward` (off by default): the server-wide default of whether the manager's
    `jump_forward` emits the tokens a grammar forces without sampling them (a request may say
    otherwise, see `GuidedDecodingManager.add_request`).
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
    compile_timeout_s: float = 10.0
    compile_isolation: Literal["process", "thread"] = "process"
    compile_memory_limit_bytes: int = 2 << 30
    compile_transfer_max_bytes: int | None = 16 << 20
    compile_demote_after_s: float = 0.5
    compile_nice: int = 10
    auto_first_ready: bool = True
    auto_fallback_grace_s: float = 0.1
    max_background_compiles: int = 32
    background_idle_class: bool = True
    first_token_wait_s: float = 0.0
    limits: AdmissionLimits = dataclasses.field(default_factory=AdmissionLimits)
    fill_threads: int = dataclasses.field(default_factory=_default_threads)
    parallel_fill_min_rows: int = 16
    rejection_policy: Literal["error"] = "error"
    think_end_token: str | None = None
    jump_forward: bool = False
    admission_budget_s: float | None = dataclasses.field(default_factory=_default_admission_budget)

    def __post_init__(self):
        if self.rejection_policy not in REJECTION_POLICIES:
            raise ValueError(f"rejection_policy must be one of {REJECTION_POLICIES}, got {self.rejection_policy!r}")
        if self.cache_limit_bytes <= 0:
            raise ValueError("cache_limit_bytes must be positive: an unbounded compile cache is a memory DoS")
        for name in ("compile_threads", "compile_workers", "fill_threads", "max_background_compiles"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.compile_timeout_s <= 0:
            raise ValueError("compile_timeout_s must be positive")
        if self.compile_isolation not in COMPILE_ISOLATIONS:
            raise ValueError(f"compile_isolation must be one of {COMPILE_ISOLATIONS}, got {self.compile_isolation!r}")
        if self.compile_memory_limit_bytes <= 0:
            raise ValueError("compile_memory_limit_bytes must be positive")
        if self.compile_transfer_max_bytes is not None and self.compile_transfer_max_bytes < 0:
            raise ValueError("compile_transfer_max_bytes must be >= 0 or None")
        if self.auto_fallback_grace_s < 0:
            raise ValueError("auto_fallback_grace_s must be >= 0")
        if self.first_token_wait_s < 0:
            raise ValueError("first_token_wait_s must be >= 0")
        if not 0 <= self.compile_nice <= 19:
            raise ValueError("compile_nice must be in [0, 19]")
        if self.compile_demote_after_s <= 0:
            raise ValueError("compile_demote_after_s must be positive")
        if self.max_whitespace_cnt is not None and self.max_whitespace_cnt < 1:
            raise ValueError("max_whitespace_cnt must be >= 1 or None")
        if self.admission_budget_s is not None and self.admission_budget_s < 0:
            raise ValueError("admission_budget_s must be >= 0 or None")
        if self.unknown_formats not in ("refuse", "annotate"):
            raise ValueError(f"unknown_formats must be 'refuse' or 'annotate', got {self.unknown_formats!r}")

    def replace(self, **changes) -> GuidedConfig:
        return dataclasses.replace(self, **changes)
