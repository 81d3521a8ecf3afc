"""`add_request` does only bounded work on the caller's thread (issue #22): the engines' checks and
the choice among them run in a compile worker (a compile thread in thread isolation), and what they
decide reaches the request, the manager's metrics and admission.

Real engines, real worker processes. Costs are compared as this thread's CPU time (what it computed,
whatever the host's load), and where the checks ran is read from the schema normaliser's own cache
(a check in this process would have filled it) or, in thread isolation, from the thread that ran them.
"""

import threading
import time

import paddle
import pytest
from guided_helpers import VOCAB, add_ready

from fd_guided import GrammarCompileTimeout, GuidedConfig, InvalidGrammarError, parse_guided_request
from fd_guided import schema as normal_form
from fd_guided.admission import cache
from fd_guided.backends.auto import AutoBackend
from fd_guided.backends.composite import CHECKS
from fd_guided.backends.llguidance import LLGuidanceBackend
from fd_guided.manager import GuidedDecodingManager
from fd_guided.registry import create_backend
from fd_guided.tokenizer import load_tokenizer

pytestmark = [pytest.mark.cpu, pytest.mark.usefixtures("fresh_admission_caches")]

# No engine enforces it (small integers: not a finite set the guard enumerates, not one it tracks).
UNIQUE_INTEGERS = {"type": "array", "items": {"type": "integer", "maximum": 5}, "uniqueItems": True}


PATTERN = "^[a-z]{2,8}-[0-9]{1,4}$"


def slow_schema(salt: str, properties: int = 120, refused: bool = False) -> dict:
    """An object whose normal form takes tens of ms of Python to work out (~0.1 s of CPU for both
    engines' checks on a loaded 2-core host): alternatives of objects, patterns, bounds. With
    `refused`, a property no engine can enforce."""
    fields = {
        f"{salt}{i}": {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"kind": {"const": f"a{i}"}, "v": {"type": "string", "pattern": PATTERN}},
                    "required": ["kind", "v"],
                },
                {
                    "type": "object",
                    "properties": {"kind": {"const": f"b{i}"}, "n": {"type": "integer", "minimum": 0, "maximum": 1000}},
                    "required": ["kind"],
                },
                {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 4},
            ]
        }
        for i in range(properties)
    }
    if refused:
        fields["tags"] = UNIQUE_INTEGERS
    return {"type": "object", "properties": fields, "required": [f"{salt}0"]}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("deepseek")


def make_manager(backend) -> GuidedDecodingManager:
    manager = GuidedDecodingManager(backend, max_num_seqs=4)
    warm = manager.validate({"guided_json": {"type": "object", "properties": {"warm": {"type": "integer"}}}})
    add_ready(manager, 3, warm)  # the workers started and warm before anything is measured
    manager.release(3)
    return manager


def auto_manager(tokenizer, **config) -> GuidedDecodingManager:
    # No admission budget: admission leaves every check that is not bounded by construction.
    config = GuidedConfig(backend="auto", admission_budget_s=0.0, **config)
    return make_manager(create_backend("auto", tokenizer, vocab_size=VOCAB, config=config))


def cpu_seconds(action) -> float:
    started = time.thread_time()
    action()
    return time.thread_time() - started


def test_a_slow_to_check_schema_is_added_at_once_and_checked_in_a_worker(tokenizer):
    manager = auto_manager(tokenizer)
    try:
        # What add_request ran on this thread before: both engines' checks (another schema of the
        # same shape, so the one added below is new to the normaliser's cache).
        measured = manager.validate({"guided_json": slow_schema("m")})
        check_s = cpu_seconds(lambda: AutoBackend.check(measured))
        spec = manager.validate({"guided_json": slow_schema("a")})
        assert spec is not None and spec.pending is not None  # nothing decided at admission
        normalised = normal_form._cached.cache_info().misses
        add_s = cpu_seconds(lambda: manager.add_request(0, spec))
        assert manager.wait_ready([0], 120)
        assert manager.slots[0].ticket.result().backend_name in ("llguidance", "xgrammar")
        assert normal_form._cached.cache_info().misses == normalised  # no engine's check ran in this process
        assert check_s > 0.01 and add_s < check_s / 10, (check_s, add_s)
    finally:
        manager.close()


def test_a_refusal_decided_in_the_worker_fails_that_request_alone_named_counted_and_remembered(tokenizer):
    manager = auto_manager(tokenizer)
    fields = {"guided_json": slow_schema("r", refused=True)}
    try:
        bad = manager.validate(fields)  # admitted: admission had no time for the engines' checks
        good = manager.validate({"guided_json": slow_schema("g", properties=4)})
        assert bad is not None and good is not None
        add_s = cpu_seconds(lambda: manager.add_request(0, bad, prefill_done=True))
        manager.add_request(1, good, prefill_done=True)
        assert manager.wait_ready([0, 1], 120)
        error = manager.slots[0].ticket.exception()
        assert isinstance(error, InvalidGrammarError) and not isinstance(error, GrammarCompileTimeout)
        assert "no backend can enforce this constraint faithfully (xgrammar: " in str(error)
        assert "; llguidance: " in str(error)
        assert error.part is not None and error.part.endswith("properties.tags.uniqueItems"), error.part
        assert error.feature is not None and "uniqueItems" in error.feature
        assert add_s < 0.01, add_s
        # That request alone fails; the other stays constrained.
        manager.begin_step([0, 1])
        logits = paddle.zeros([2, VOCAB], dtype="float32")
        manager.apply(logits)
        assert 0 < int(paddle.isfinite(logits[1]).sum()) < VOCAB
        allowed = int(paddle.argmax(logits[1]))  # a token slot 1's grammar allows
        finishes = {finish.slot: finish for finish in manager.accept([1, allowed])}
        assert finishes[0].reason == "error" and "uniqueItems" in finishes[0].error
        assert 1 not in finishes
        # Counted in the manager's metrics, once.
        assert manager.metrics.value("deferred_admission_refusals_total") == 1
        # Remembered: the next identical request is refused at admission, with the same error.
        with pytest.raises(InvalidGrammarError) as again:
            manager.validate(fields)
        assert (str(again.value), again.value.part, again.value.feature) == (str(error), error.part, error.feature)
    finally:
        manager.close()
    # The verdict inline admission gives, word for word.
    cache.PARSED.clear()
    cache.CHECKED.clear()
    with pytest.raises(InvalidGrammarError) as inline:
        parse_guided_request(fields, GuidedConfig(backend="auto", admission_budget_s=None))
    assert (str(inline.value), inline.value.part, inline.value.feature) == (str(error), error.part, error.feature)


def test_a_spec_decided_before_is_a_cache_lookup_and_identical_ones_share_one_ticket(tokenizer):
    manager = auto_manager(tokenizer)
    try:
        spec = manager.validate({"guided_json": slow_schema("w")})
        ticket = manager.compiler.submit(spec)  # as `prefetch` does
        manager.add_request(0, spec)
        assert manager.slots[0].ticket is ticket and manager.metrics.value("inflight_joins_total") == 1
        assert manager.wait_ready([0], 120)
        manager.release(0)
        hits = manager.metrics.value("cache_hits_total")
        add_s = cpu_seconds(lambda: manager.add_request(0, spec))
        assert manager.is_ready(0) and manager.metrics.value("cache_hits_total") == hits + 1
        assert add_s < 0.01, add_s
    finally:
        manager.close()


def test_a_spec_whose_checks_admission_ran_needs_no_checks_job(tokenizer):
    """Admission that decided the engines' checks within its budget (here: inline) leaves its
    choice for add_request: no job runs them again, the request is served all the same."""
    config = GuidedConfig(backend="auto", admission_budget_s=None)
    manager = make_manager(create_backend("auto", tokenizer, vocab_size=VOCAB, config=config))
    try:
        jobs, submit = [], manager.compiler._runner.submit

        def recording(engine, spec):  # a spy over the real pool: which jobs reach it
            jobs.append(engine)
            return submit(engine, spec)

        manager.compiler._runner.submit = recording
        decided = manager.validate({"guided_json": slow_schema("d", properties=10)})
        add_ready(manager, 0, decided)
        assert manager.slots[0].ticket.result().backend_name in ("llguidance", "xgrammar")
        assert CHECKS not in jobs and jobs, jobs
    finally:
        manager.close()


def test_checks_that_run_away_are_stopped_at_the_compile_budget_and_fail_only_that_request(tokenizer):
    # The checks of an 800-property schema take ~2.4 s of one core here; a quick regex ~30 ms in a
    # freshly forked worker, ~0.11 s with three busy loops beside it (what a second pytest-xdist
    # worker and the pool's own cache compiles do). 0.5 s separates them with room on both sides.
    # (No retry can help a budget overrun: the error is remembered for `budget_ttl_s`.)
    manager = auto_manager(tokenizer, compile_timeout_s=0.5)
    try:
        spec = manager.validate({"guided_json": slow_schema("t", properties=800)})
        manager.add_request(0, spec)
        assert manager.wait_ready([0], 60)
        error = manager.slots[0].ticket.exception()
        assert isinstance(error, GrammarCompileTimeout) and "engine-checks" in str(error)
        assert manager.validate({"guided_json": slow_schema("t", properties=800)}) is not None  # not a refusal
        # The service goes on: a quick request is served, by a worker forked after the kill.
        add_ready(manager, 1, manager.validate({"guided_regex": "[a-z]{1,4}"}))
        assert manager.slots[1].ticket.exception() is None
    finally:
        manager.close()


class RecordingLLGuidance(LLGuidanceBackend):
    """The real llguidance backend, noting which thread runs its check."""

    threads: list[int] = []

    @classmethod
    def check(cls, spec):
        cls.threads.append(threading.get_ident())
        super().check(spec)


def test_in_thread_isolation_the_checks_run_on_a_compile_thread_not_the_callers(tokenizer):
    config = GuidedConfig(backend="llguidance", compile_isolation="thread", admission_budget_s=0.0)
    manager = make_manager(RecordingLLGuidance(tokenizer, vocab_size=VOCAB, config=config))
    try:
        RecordingLLGuidance.threads.clear()
        spec = manager.validate({"guided_json": slow_schema("i", properties=20)})
        bad = manager.validate({"guided_json": {"type": "object", "properties": {"tags": UNIQUE_INTEGERS}}})
        assert RecordingLLGuidance.threads == []  # admission left the check
        manager.add_request(0, spec)
        manager.add_request(1, bad)
        assert manager.wait_ready([0, 1], 120)
        assert manager.slots[0].ticket.exception() is None
        error = manager.slots[1].ticket.exception()
        assert isinstance(error, InvalidGrammarError) and "uniqueItems" in str(error)
        assert RecordingLLGuidance.threads and threading.get_ident() not in RecordingLLGuidance.threads
        assert manager.metrics.value("deferred_admission_refusals_total") == 1
        with pytest.raises(InvalidGrammarError, match="uniqueItems"):
            manager.validate({"guided_json": {"type": "object", "properties": {"tags": UNIQUE_INTEGERS}}})
    finally:
        manager.close()
