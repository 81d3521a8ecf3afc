"""Metric values match what the test did, and the Prometheus text parses line by line."""
import re
import threading
import time

import numpy as np
import pytest

from fd_guided import GuidedConfig, parse_guided_request
from fd_guided.backends.xgrammar import XGrammarBackend
from fd_guided.compile import CompileService
from fd_guided.integrations.fastdeploy import GuidedDecoding, get_guided_backend
from fd_guided.manager import GuidedDecodingManager
from fd_guided.metrics import GuidedMetrics
from fd_guided.tokenizer import load_tokenizer

from fd_runner import fd_config
from guided_helpers import add_ready

pytestmark = pytest.mark.cpu

VOCAB = 129_280
SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"]*")*\})? '
                    r'(-?[0-9.]+(e[+-]?[0-9]+)?|\+Inf|NaN)$')


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("deepseek")


@pytest.fixture()
def backend(tokenizer):
    backend = XGrammarBackend(tokenizer, vocab_size=VOCAB, config=GuidedConfig(compile_timeout_s=10))
    yield backend
    backend.close()


def regex_spec(pattern: str):
    return parse_guided_request({"guided_regex": pattern})


def token_of(tokenizer, text):
    ids = tokenizer.encode(text)
    assert len(ids) == 1
    return ids[0]


def parse_prometheus(text: str) -> dict[str, float]:
    samples = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+$", line), line
            continue
        assert SAMPLE.match(line), line
        name, value = line.rsplit(" ", 1)
        samples[name] = float(value)
    return samples


def test_repeated_schemas_through_the_adapter_count_one_miss_then_hits(tokenizer):
    repeats = 7
    backend = get_guided_backend(fd_config(max_num_seqs=repeats + 1), tokenizer=tokenizer)
    decoding = GuidedDecoding(fd_config(max_num_seqs=repeats + 1))
    key = ("regex", "[0-9]{3}-metrics")
    try:
        for slot in range(repeats + 1):
            future = backend.get_logits_processor(key)
            future.result(timeout=10)
            decoding.add_logits_processor(slot, future)  # must not count a second lookup
        decoding.pre_process(list(range(repeats + 1)))  # every prefill ends: the requests join the manager
        metrics = backend.metrics
        assert metrics.value("compile_requests_total") == repeats + 1
        assert metrics.value("cache_misses_total") == 1 and metrics.value("cache_hits_total") == repeats
        assert metrics.value("compile_seconds") == 1 and metrics.histogram_sum("compile_seconds") > 0
        assert metrics.value("requests_total") == repeats + 1
    finally:
        decoding.close()
        backend.close()


class GatedBackend(XGrammarBackend):
    """Compiles wait for `gate`: lets a test hold compiles in flight."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()

    def compile(self, spec):
        self.gate.wait(20)
        return super().compile(spec)


def test_compiles_in_flight_rise_and_return_to_zero(tokenizer):
    backend = GatedBackend(tokenizer, vocab_size=VOCAB, config=GuidedConfig(compile_workers=4, compile_isolation="thread"))
    service = CompileService(backend)
    try:
        futures = [service.submit(regex_spec(f"[a-z]{{{n}}}x")) for n in range(1, 4)]
        joined = service.submit(regex_spec("[a-z]{1}x"))  # identical spec: joins, no new compile
        # Each spec's checks job (not admitted here, so its engine's check runs as a job of its own)
        # is not gated: it ends by itself, leaving the three gated compiles.
        deadline = time.monotonic() + 10
        while service.metrics.value("compiles_in_flight") != 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert service.metrics.value("compiles_in_flight") == 3
        assert service.metrics.value("inflight_joins_total") == 1
        backend.gate.set()
        for future in futures + [joined]:
            future.result(timeout=20)
        assert service.metrics.value("compiles_in_flight") == 0
        assert service.metrics.value("cache_misses_total") == 3 and service.metrics.value("compile_seconds") == 3
    finally:
        backend.gate.set()
        service.close()


def test_compile_timeouts_and_unready_samples_are_counted(tokenizer):
    backend = GatedBackend(tokenizer, vocab_size=VOCAB, config=GuidedConfig(compile_timeout_s=0.2, compile_isolation="thread"))
    manager = GuidedDecodingManager(backend, max_num_seqs=2)
    try:
        manager.add_request(0, regex_spec("slow[0-9]"), prefill_done=True)
        manager.add_request(1, regex_spec("slower[0-9]"), prefill_done=True)
        manager.begin_step([0, 1])  # sampled before ready: both fail at once, the step does not wait
        manager.apply(np.zeros((2, VOCAB), dtype=np.float32))
        finishes = manager.accept([1, 1])
        assert {f.reason for f in finishes} == {"error"}
        assert manager.metrics.value("unready_samples_total") == 2
        deadline = time.monotonic() + 10
        while manager.metrics.value("compile_timeouts_total") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert manager.metrics.value("compile_timeouts_total") == 2  # each compile hit its budget
        assert "fd_guided_unready_samples_total 2" in manager.metrics.to_prometheus()
    finally:
        backend.gate.set()
        manager.close()


def test_step_histograms_count_every_step_and_rejections_are_counted(backend, tokenizer):
    steps = 25
    manager = GuidedDecodingManager(backend, max_num_seqs=2)
    letter = token_of(tokenizer, "a")
    try:
        spec, choice = regex_spec("[a-z]{100}"), parse_guided_request({"guided_choice": ["yes", "no"]})
        for compiled_first in (spec, choice):  # no compile left to join: one fill per step
            manager.compiler.compile_now(compiled_first)
        add_ready(manager, 0, spec, prefill_done=True)
        add_ready(manager, 1, choice, prefill_done=True)
        for step in range(steps):
            manager.begin_step([0, 1] if step == 0 else [0])
            manager.apply(np.zeros((2 if step == 0 else 1, VOCAB), dtype=np.float32))
            manager.accept([letter, token_of(tokenizer, "maybe")] if step == 0 else [letter])
        metrics = manager.metrics
        for name in ("fill_seconds", "fill_join_seconds", "apply_seconds", "accept_seconds"):
            assert metrics.value(name) == steps, name
        assert metrics.value("rejected_tokens_total") == 1  # "maybe" is not "yes" or "no"
        assert metrics.value("requests_finished_total") == 1
        assert metrics.labelled("requests_by_backend_total") == {"xgrammar": 2}
        assert metrics.value("cache_hits_total") == 2 and metrics.value("cache_misses_total") == 2
    finally:
        manager.close()


class DictCache:
    """A real (in-memory) `SharedGrammarCache`: what a second instance would find in Redis."""

    def __init__(self):
        self.data = {}

    def get(self, spec, backend):
        return self.data.get(spec)

    def put(self, spec, backend, data):
        self.data[spec] = data


def test_shared_cache_hits_are_counted_per_instance(backend):
    shared = DictCache()
    specs = [regex_spec(f"[0-9]{{{n}}}-shared") for n in range(1, 5)]
    first, second = CompileService(backend, shared_cache=shared), CompileService(backend, shared_cache=shared)
    try:
        for spec in specs:
            first.compile_now(spec)
            second.compile_now(spec)
        assert first.metrics.value("shared_cache_misses_total") == len(specs) and first.metrics.value("compile_seconds") == len(specs)
        assert second.metrics.value("shared_cache_hits_total") == len(specs) and second.metrics.value("compile_seconds") == 0
    finally:
        first.close()
        second.close()


def test_prometheus_text_parses_and_matches_the_python_values(backend, tokenizer):
    metrics = GuidedMetrics()
    manager = GuidedDecodingManager(backend, max_num_seqs=2, metrics=metrics)
    try:
        spec = parse_guided_request({"guided_choice": ["yes", "no"]})
        for round_ in range(3):
            add_ready(manager, 0, spec, prefill_done=True)
            manager.begin_step([0])
            manager.apply(np.zeros((1, VOCAB), dtype=np.float32))
            manager.accept([token_of(tokenizer, "yes")])
            manager.release(0)
    finally:
        manager.close()
    samples = parse_prometheus(metrics.to_prometheus())
    assert samples['fd_guided_requests_by_backend_total{backend="xgrammar"}'] == 3
    for name in GuidedMetrics.COUNTERS:
        assert samples[f"fd_guided_{name}"] == metrics.value(name), name
    for name in GuidedMetrics.GAUGES:
        assert samples[f"fd_guided_{name}"] == metrics.value(name), name
    for name in GuidedMetrics.HISTOGRAMS:
        assert samples[f"fd_guided_{name}_count"] == metrics.value(name)
        assert samples[f'fd_guided_{name}_bucket{{le="+Inf"}}'] == metrics.value(name)
    assert samples["fd_guided_cache_hits_total"] == 2 and samples["fd_guided_cache_misses_total"] == 1
    assert samples["fd_guided_apply_seconds_count"] == 3
    assert metrics.snapshot()["apply_seconds_count"] == 3
