"""Counters, gauges and histograms of guided decoding, readable from Python and as Prometheus text.

Deliberately tiny and dependency-free: a serving stack scrapes `GuidedMetrics.to_prometheus()` or
copies values into its own registry. All updates are thread-safe (compiles finish on pool threads).
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field

DEFAULT_SECONDS_BUCKETS = (
    0.0001,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


@dataclass
class Histogram:
    buckets: tuple[float, ...] = DEFAULT_SECONDS_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self):
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1


class GuidedMetrics:
    """Process-local metrics of one guided-decoding manager (or shared by several)."""

    COUNTERS = {
        "compile_requests_total": "Compiles asked for (including cache hits and joins of in-flight compiles).",
        "cache_hits_total": "Compiles served from the compiled-grammar cache.",
        "cache_misses_total": "Compiles that ran the backend compiler.",
        "inflight_joins_total": "Compiles that joined an identical compile already in flight.",
        "compile_errors_total": "Compiles that failed (invalid grammar).",
        "deferred_admission_refusals_total": (
            "Constraints refused by admission checks decided off the caller's thread, in a compile worker "
            "(schema checks and grammar syntax past the admission budget, the engines' checks)."
        ),
        "compile_timeouts_total": "Compiles stopped at their time budget (the worker was killed).",
        "background_compiles_dropped_total": (
            "Cache-only compiles (their request was served by another engine) dropped from a full backlog."
        ),
        "compile_budget_failures_total": (
            "Requests failed because their compile ran past its time or memory budget or crashed."
        ),
        "unready_samples_total": (
            "Guided rows sampled before their grammar was ready (the request failed; hosts wait for is_ready)."
        ),
        "dead_end_rows_total": (
            "Rows the grammar left without any allowed token (the request failed, the row allowed stop tokens)."
        ),
        "rejected_tokens_total": "Sampled tokens the grammar rejected (the request finished with an error).",
        "out_of_mask_tokens_total": (
            "Tokens outside their row's applied mask that the host is not known to force "
            "(the request finished with an error)."
        ),
        "requests_total": "Guided requests added.",
        "requests_finished_total": "Guided requests finished by the grammar (stop) or by an error.",
        "compiles_rebuilt_here_total": (
            "Grammars a worker compiled that this process compiled again instead of receiving them "
            "(estimated past compile_transfer_max_bytes, or slower to send than to compile)."
        ),
        "shared_cache_hits_total": "Compiles served from the shared (L2) cache.",
        "shared_cache_misses_total": "Shared (L2) cache lookups that found nothing usable.",
        "draft_tokens_total": "Draft tokens of speculative steps whose rows were masked.",
        "draft_tokens_invalid_total": (
            "Draft tokens the grammar rejected (their chain ended there; the host must not accept them)."
        ),
        "jump_forward_tokens_total": "Tokens emitted by jump-forward without a sample.",
        "jump_forward_retracted_tokens_total": (
            "Sampled tokens jump-forward re-encoded at the boundary (retracted, then re-emitted)."
        ),
        "reasoning_forced_tokens_total": "Think-end marker tokens forced because a request spent its reasoning budget.",
        "budget_steered_requests_total": (
            "Requests whose rows budget steering restricted to end complete within max_tokens."
        ),
        "budget_forced_tokens_total": "Rows budget steering restricted (tokens chosen within the closing plan).",
        "budget_refused_requests_total": (
            "Requests failed at their first step: max_tokens below the shortest valid output."
        ),
        "budget_reasoning_cut_total": (
            "Reasoning sections ended early to leave max_tokens room for the shortest valid output."
        ),
        "budget_overruns_total": (
            "Budgeted requests whose shortest completion outgrew the tokens left before their closing phase."
        ),
        "budget_search_failures_total": (
            "Shortest-completion searches that found nothing within their bound (the request is not steered)."
        ),
        "first_mask_rows_total": (
            "Rows of a request's first states copied from an earlier request's fill instead of filled."
        ),
    }
    GAUGES = {
        "compiles_in_flight": "Compiles submitted and not finished.",
        "cache_bytes": "Bytes held by the compiled-grammar cache.",
    }
    HISTOGRAMS = {
        "compile_seconds": "Time to compile one grammar (cache misses only).",
        "compile_wait_seconds": "Time a decode step waited for a compile to finish.",
        "fill_seconds": "Time per step spent filling bitmask rows (including the part overlapped with the forward).",
        "fill_join_seconds": "Time per step the host waited for the overlapped fill to finish.",
        "apply_seconds": "Time per step spent applying the mask to the logits.",
        "accept_seconds": "Time per step spent advancing matchers with sampled tokens.",
    }

    def __init__(self, namespace: str = "fd_guided"):
        self.namespace = namespace
        self._lock = threading.Lock()
        self._counters = {name: 0 for name in self.COUNTERS}
        self._gauges = {name: 0.0 for name in self.GAUGES}
        self._histograms = {name: Histogram() for name in self.HISTOGRAMS}
        self._labelled: dict[tuple[str, str, str], int] = {}

    def inc(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._counters[name] += amount

    def inc_labelled(self, name: str, label: str, value: str, amount: int = 1) -> None:
        """A counter with one label (e.g. backend chosen per request)."""
        with self._lock:
            key = (name, label, value)
            self._labelled[key] = self._labelled.get(key, 0) + amount

    def set_gauge(self, name: str, value: float) -> None:
        with self._lock:
            self._gauges[name] = value

    def add_gauge(self, name: str, delta: float) -> None:
        with self._lock:
            self._gauges[name] += delta

    def observe(self, name: str, seconds: float) -> None:
        with self._lock:
            self._histograms[name].observe(seconds)

    def value(self, name: str) -> float:
        """Current value of a counter or gauge, or the observation count of a histogram."""
        with self._lock:
            if name in self._counters:
                return self._counters[name]
            if name in self._gauges:
                return self._gauges[name]
            return self._histograms[name].count

    def histogram_sum(self, name: str) -> float:
        with self._lock:
            return self._histograms[name].total

    def labelled(self, name: str) -> dict[str, int]:
        with self._lock:
            return {value: count for (metric, _, value), count in self._labelled.items() if metric == name}

    def snapshot(self) -> dict[str, float]:
        """Counters, gauges and histogram sums/counts as one flat dict."""
        with self._lock:
            data: dict[str, float] = dict(self._counters)
            data.update(self._gauges)
            for name, hist in self._histograms.items():
                data[f"{name}_sum"] = hist.total
                data[f"{name}_count"] = hist.count
            return data

    def to_prometheus(self) -> str:
        """The Prometheus text exposition format (version 0.0.4)."""
        lines: list[str] = []
        with self._lock:
            for name, help_text in self.COUNTERS.items():
                full = f"{self.namespace}_{name}"
                lines += [f"# HELP {full} {help_text}", f"# TYPE {full} counter", f"{full} {self._counters[name]}"]
            for (name, label, value), count in sorted(self._labelled.items()):
                lines.append(f'{self.namespace}_{name}{{{label}="{value}"}} {count}')
            for name, help_text in self.GAUGES.items():
                full = f"{self.namespace}_{name}"
                lines += [f"# HELP {full} {help_text}", f"# TYPE {full} gauge", f"{full} {self._gauges[name]:g}"]
            for name, help_text in self.HISTOGRAMS.items():
                lines += self._histogram_lines(f"{self.namespace}_{name}", help_text, self._histograms[name])
        return "\n".join(lines) + "\n"

    @staticmethod
    def _histogram_lines(full: str, help_text: str, hist: Histogram) -> list[str]:
        lines = [f"# HELP {full} {help_text}", f"# TYPE {full} histogram"]
        cumulative = 0
        for bound, count in zip(hist.buckets, hist.counts):
            cumulative += count
            lines.append(f'{full}_bucket{{le="{bound:g}"}} {cumulative}')
        lines.append(f'{full}_bucket{{le="+Inf"}} {hist.count}')
        lines.append(f"{full}_sum {hist.total:g}")
        lines.append(f"{full}_count {hist.count}")
        return lines
