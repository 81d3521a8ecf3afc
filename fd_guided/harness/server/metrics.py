"""``/metrics``: the manager's guided-decoding metrics and the server's own, through prometheus-client.

Two registries, one per process: `ServerMetrics` in the API process (HTTP, loop lag, IPC transit,
the engine process's restarts) and `EngineMetrics` in the engine process (the manager's metrics,
step times, inter-token gaps, finishes as the engine saw them). ``/metrics`` answers both in one
exposition: the API process asks the engine process for its text on each scrape (names never
collide: the engine's own start ``fd_guided_engine_`` or are the ones they always were).

Each app owns a `CollectorRegistry` (several servers can live in one process, e.g. in tests). The
manager's `GuidedMetrics` stays dependency-free; `GuidedMetricsCollector` reads its exposition
text on every scrape and hands the families to prometheus-client (labelled counters, which
`GuidedMetrics` prints without a TYPE line, are typed as counters here), so every metric the
manager gains later is exported with no change here.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from fd_guided.metrics import GuidedMetrics

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Loop lag is interesting from 0.1 ms up; request times up to minutes.
_LAG_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
_STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_REQUEST_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class GuidedMetricsCollector:
    """A prometheus-client collector over a `GuidedMetrics` (see the module docstring)."""

    def __init__(self, metrics: GuidedMetrics):
        self.metrics = metrics

    def collect(self):
        for family in text_string_to_metric_families(self.metrics.to_prometheus()):
            if family.type == "unknown" and family.name.endswith("_total"):
                labels = sorted({key for sample in family.samples for key in sample.labels})
                counter = CounterMetricFamily(
                    family.name[: -len("_total")], "Labelled guided-decoding counter.", labels=labels
                )
                for sample in family.samples:
                    counter.add_metric([sample.labels.get(key, "") for key in labels], sample.value)
                yield counter
            else:
                yield family


class ServerMetrics:
    """The API process's metrics (names start ``fd_guided_server_``)."""

    def __init__(self):
        self.registry = CollectorRegistry()
        ns = "fd_guided_server"
        self.requests = Counter(
            "requests",
            "HTTP requests answered, by endpoint and status code.",
            ["endpoint", "status"],
            namespace=ns,
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "request_seconds",
            "Time from arrival to the last byte of a generation request.",
            ["endpoint"],
            namespace=ns,
            buckets=_REQUEST_BUCKETS,
            registry=self.registry,
        )
        self.ttft_seconds = Histogram(
            "time_to_first_token_seconds",
            "Time from arrival to the first generated token.",
            ["endpoint"],
            namespace=ns,
            buckets=_REQUEST_BUCKETS,
            registry=self.registry,
        )
        self.finished = Counter(
            "choices_finished", "Choices finished, by finish_reason.", ["reason"], namespace=ns, registry=self.registry
        )
        self.prompt_tokens = Counter(
            "prompt_tokens", "Prompt tokens of finished choices.", namespace=ns, registry=self.registry
        )
        self.generated_tokens = Counter(
            "generated_tokens", "Tokens generated for finished choices.", namespace=ns, registry=self.registry
        )
        self.loop_lag_seconds = Histogram(
            "event_loop_lag_seconds",
            "How late a 10 ms timer on the event loop fires.",
            namespace=ns,
            buckets=_LAG_BUCKETS,
            registry=self.registry,
        )
        self.ipc_seconds = Histogram(
            "ipc_transit_seconds",
            "From the engine process sending a step's updates to the API process decoding them.",
            namespace=ns,
            buckets=_LAG_BUCKETS,
            registry=self.registry,
        )
        self.engine_up = Gauge(
            "engine_up",
            "1 while the engine process is serving, 0 while it is down or starting.",
            namespace=ns,
            registry=self.registry,
        )
        self.engine_restarts = Counter(
            "engine_restarts", "Engine processes started again after one died.", namespace=ns, registry=self.registry
        )
        self.refused = Counter(
            "requests_refused",
            "Requests refused before any work, by reason (body_too_large, "
            "context_length_exceeded, engine_unavailable).",
            ["reason"],
            namespace=ns,
            registry=self.registry,
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class EngineMetrics:
    """The engine process's metrics: the manager's (``fd_guided_``), and the step and gap histograms
    (``fd_guided_server_engine_step_seconds``, ``fd_guided_server_token_gap_seconds``, as before the split)."""

    def __init__(self, guided: GuidedMetrics | None):
        self.registry = CollectorRegistry()
        if guided is not None:
            self.registry.register(GuidedMetricsCollector(guided))
        ns = "fd_guided_server"
        self.step_seconds = Histogram(
            "engine_step_seconds",
            "Time of one engine step with a forward (mask and sample included).",
            namespace=ns,
            buckets=_STEP_BUCKETS,
            registry=self.registry,
        )
        self.token_gap_seconds = Histogram(
            "token_gap_seconds",
            "Per step, the longest time a request that got a token waited since its previous "
            "token (a stalled step shows here).",
            namespace=ns,
            buckets=_STEP_BUCKETS,
            registry=self.registry,
        )
        self.finished = Counter(
            "engine_requests_finished",
            "Engine requests finished, by reason as the engine saw it "
            "(abort: a client that went away, or a stop string).",
            ["reason"],
            namespace="fd_guided",
            registry=self.registry,
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
