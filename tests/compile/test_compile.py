"""The compile service: futures, shared in-flight compiles, bounded cache, errors inside futures, timeouts."""
import threading
import time

import pytest

from fd_guided import GrammarCompileTimeout, GuidedConfig, InvalidGrammarError, parse_guided_request
from fd_guided.backends.xgrammar import XGrammarBackend
from fd_guided.compile import CompiledGrammarCache, CompileService, join
from fd_guided.spec import GrammarSpec
from fd_guided.tokenizer import load_tokenizer

pytestmark = pytest.mark.cpu


class GatedBackend(XGrammarBackend):
    """The real xgrammar backend whose compiles wait for a gate: makes in-flight windows observable."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.compiles = 0

    def compile(self, spec):
        self.compiles += 1
        self.gate.wait(10)
        return super().compile(spec)


@pytest.fixture()
def gated():
    # Thread isolation: the gate is an in-process Event (tests/test_compile_workers.py covers processes).
    backend = GatedBackend(load_tokenizer("deepseek"), vocab_size=129_280, config=GuidedConfig(compile_workers=2, compile_isolation="thread"))
    service = CompileService(backend)
    yield backend, service
    backend.gate.set()
    service.close()


def spec_of(i: int) -> GrammarSpec:
    return parse_guided_request({"guided_json": {"type": "object", "properties": {f"k{i}": {"type": "integer"}}, "required": [f"k{i}"]}})


def test_identical_specs_in_flight_share_one_compile(gated):
    backend, service = gated
    futures = [service.submit(spec_of(0)) for _ in range(5)]
    assert len({id(f) for f in futures}) == 1
    backend.gate.set()
    compiled = futures[0].result(timeout=10)
    assert backend.compiles == 1
    assert service.metrics.value("inflight_joins_total") == 4
    assert service.submit(spec_of(0)).result() is compiled  # now from the cache
    assert service.metrics.value("cache_hits_total") == 1
    assert service.metrics.value("compiles_in_flight") == 0


def test_submit_never_blocks_and_join_times_out(gated):
    backend, service = gated
    started = time.perf_counter()
    future = service.submit(spec_of(1))
    assert time.perf_counter() - started < 0.5
    with pytest.raises(GrammarCompileTimeout):
        join(future, time.monotonic() + 0.05)
    backend.gate.set()
    assert join(future, time.monotonic() + 10).spec == spec_of(1)


def test_compile_error_travels_in_the_future_and_is_remembered():
    backend = XGrammarBackend(load_tokenizer("deepseek"), vocab_size=129_280)
    service = CompileService(backend)
    # Passes the pure-Python check; xgrammar's own compiler refuses it (in a worker process).
    bad = parse_guided_request({"guided_json": {"type": "object", "properties": {"a": {}, "b": {}}, "if": {"required": ["a"]},
                                                "else": {"minProperties": 2}}}, GuidedConfig(backend="xgrammar"))
    with pytest.raises(InvalidGrammarError, match="rejected by xgrammar"):
        service.submit(bad).result(timeout=60)
    with pytest.raises(InvalidGrammarError):
        service.submit(bad).result(timeout=1)
    assert service.metrics.value("compile_errors_total") == 1  # the second was answered from memory
    assert service.compile_now(spec_of(2)).spec == spec_of(2)  # the service still works
    service.close()


class Sized:
    def __init__(self, size):
        self.memory_bytes = size


def test_cache_is_bounded_by_bytes_and_lru():
    from fd_guided.compile.cache import ENTRY_OVERHEAD_BYTES, key_bytes

    a, b, c = (("xgrammar", spec_of(i)) for i in (10, 11, 12))
    entry = 40 + key_bytes(a) + ENTRY_OVERHEAD_BYTES  # values, their keys' text and bookkeeping count
    cache = CompiledGrammarCache(limit_bytes=2 * entry + 10)
    cache.put(a, Sized(40))
    cache.put(b, Sized(40))
    assert cache.get(a) is not None  # a is now most recent
    cache.put(c, Sized(40))          # evicts b, the least recently used
    assert cache.get(b) is None and cache.get(a) is not None and cache.get(c) is not None
    assert cache.size_bytes == 2 * entry
    cache.put(("xgrammar", spec_of(13)), Sized(10_000))  # larger than the whole cache: not stored
    assert cache.size_bytes == 2 * entry


def test_remembered_errors_are_bounded_by_bytes_and_budget_errors_expire():
    from fd_guided.compile import RememberedErrors

    errors = RememberedErrors(limit_bytes=4096, budget_ttl_s=0.05)
    big = GrammarSpec("regex", "a" * 3000)
    errors.put(("xgrammar", big), InvalidGrammarError("bad"), transient=False)
    errors.put(("xgrammar", spec_of(1)), GrammarCompileTimeout("slow"), transient=True)
    assert errors.get(("xgrammar", spec_of(1))) is not None and errors.size_bytes <= 4096
    errors.put(("llguidance", big), InvalidGrammarError("bad"), transient=False)  # evicts the oldest
    assert errors.get(("xgrammar", big)) is None and errors.size_bytes <= 4096
    time.sleep(0.1)
    assert errors.get(("xgrammar", spec_of(1))) is None  # a timeout under load is retried later


def test_default_cache_is_far_above_fastdeploys_4mib():
    assert GuidedConfig().cache_limit_bytes >= 256 * 1024 * 1024
    with pytest.raises(ValueError, match="unbounded"):
        GuidedConfig(cache_limit_bytes=-1)
