"""A cold request is ready in its own engine's compile time, whatever the cache work behind it.

Heavy cache work: a choice of 10,000 strings, which auto prefers xgrammar for, compiles with
llguidance in well under a second and with xgrammar in seconds, so with ``auto`` every such request
is served by llguidance and leaves an xgrammar compile that only fills the cache. Real engines, real
worker processes.
"""

import time

import pytest

from fd_guided import GuidedConfig, parse_guided_request
from fd_guided.backends.auto import AutoBackend
from fd_guided.backends.composite import CHECKS
from fd_guided.compile import CompileService
from fd_guided.limits import AdmissionLimits
from fd_guided.registry import create_backend
from fd_guided.tokenizer import load_tokenizer

pytestmark = pytest.mark.cpu

VOCAB = 129_280


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("deepseek")


def heavy(i, count: int = 10_000) -> dict:
    return {"guided_choice": [f"heavy{i}-{k}x{k * 7919 % 100003}" for k in range(count)]}


def light(i) -> dict:
    return {
        "guided_json": {"type": "object", "properties": {f"light{i}": {"type": "integer"}}, "required": [f"light{i}"]}
    }


def spec_of(fields, **config):
    return parse_guided_request(
        fields, GuidedConfig(backend="auto", limits=AdmissionLimits(max_choices=10**6), **config)
    )


def test_a_cold_request_is_ready_while_a_backlog_of_heavy_cache_compiles_runs(tokenizer):
    # One foreground worker: before the cache-only lane, a backlog past twice that many jobs ran
    # its xgrammar compiles on the foreground worker, and a cold request waited for one (seconds).
    config = GuidedConfig(backend="auto", compile_workers=1, compile_timeout_s=120)
    service = CompileService(create_backend("auto", tokenizer, vocab_size=VOCAB, config=config))
    try:
        service.compile_now(spec_of(light("warm")))
        backlog = [spec_of(heavy(i)) for i in range(6)]
        assert all(t.result(timeout=120).backend_name == "llguidance" for t in [service.submit(s) for s in backlog])
        waits = []
        for i in range(5):
            started = time.monotonic()
            service.submit(spec_of(light(i))).result(timeout=60)
            waits.append(time.monotonic() - started)
        # The backlog was really there: xgrammar had not compiled it all while the cold requests ran.
        assert sum(service.cache.get(("xgrammar", spec)) is not None for spec in backlog) < len(backlog)
        assert sorted(waits)[len(waits) // 2] < 0.5, waits
        assert max(waits) < 2.0, waits
    finally:
        service.close()


class _Gains(AutoBackend):
    """auto with the preferred engine's expected gain stated instead of measured."""

    gain_s = 0.0

    def expected_gain_s(self, engine: str, over: str) -> float:
        return self.gain_s


@pytest.mark.parametrize("gain_s, served_by", [(0.0, "llguidance"), (600.0, "xgrammar")])
def test_a_ready_request_waits_for_the_preferred_engine_only_what_it_is_expected_to_gain(tokenizer, gain_s, served_by):
    # A cap far above xgrammar's compile time: the wait is bounded by the gain, not by the cap.
    config = GuidedConfig(backend="auto", auto_fallback_grace_s=300.0, compile_timeout_s=120)
    backend = _Gains(tokenizer, vocab_size=VOCAB, config=config)
    backend.gain_s = gain_s
    service = CompileService(backend)
    try:
        service.compile_now(spec_of(light("warm")))
        spec = spec_of(heavy(f"gain{gain_s}", 4_000))
        assert backend.compile_engines(spec)[0] == "xgrammar"
        assert service.submit(spec).result(timeout=120).backend_name == served_by
    finally:
        service.close()


def bounded_strings(count: int, salt: str) -> dict:
    """An object of bounded strings: auto prefers llguidance (xgrammar would narrow them), and
    xgrammar could serve it only if llguidance failed."""
    properties = {f"{salt}{i}": {"type": "string", "maxLength": 40} for i in range(count)}
    return {"guided_json": {"type": "object", "properties": properties, "required": list(properties)}}


def engines_started(service) -> list[str]:
    """The engines whose jobs reach the runner, in order (a spy over the real pool); the job
    that runs the engines' checks shows as `CHECKS`."""
    started, submit = [], service._runner.submit

    def recording(engine, spec):
        started.append(engine)
        return submit(engine, spec)

    service._runner.submit = recording
    return started


@pytest.mark.parametrize("properties, demote_after_s, started", [
    # llguidance ready in milliseconds: xgrammar is never started (before, it started at once,
    # took a core from llguidance's compile, and its worker was killed and re-forked, ~10 ms).
    (40, 0.5, ["llguidance"]),
    # llguidance still compiling past compile_demote_after_s: xgrammar is started as a hedge.
    (2_000, 0.02, ["llguidance", "xgrammar"]),
])
def test_a_slower_less_preferred_engine_is_a_hedge_not_a_race(tokenizer, properties, demote_after_s, started):
    limits = AdmissionLimits(max_constraint_bytes=10**7)
    config = GuidedConfig(backend="auto", compile_timeout_s=120, compile_demote_after_s=demote_after_s, limits=limits)
    service = CompileService(create_backend("auto", tokenizer, vocab_size=VOCAB, config=config))
    try:
        service.compile_now(spec_of(light("warm")))
        seen = engines_started(service)
        spec = parse_guided_request(bounded_strings(properties, f"h{properties}_"), config)
        assert service.backend.compile_engines(spec) == ("llguidance", "xgrammar")
        assert service.submit(spec).result(timeout=60).backend_name == "llguidance"
        time.sleep(0.2)  # a hedge timer still armed would start xgrammar now
        # (a job runs the engines' checks too where admission left them: not an engine)
        assert [engine for engine in seen if engine != CHECKS] == started
    finally:
        service.close()
