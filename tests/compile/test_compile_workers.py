"""Compiles in killable worker processes: crashes, budgets, demotion, shutdown, fallback, no head-of-line blocking.

Every case that could crash a process runs in a fresh interpreter (`tests.isolated`), so a crash
fails that test and not the suite.
"""
import os
import time

import pytest

from fd_guided import GuidedConfig, InvalidGrammarError, parse_guided_request
from fd_guided.compile import CompileService
from fd_guided.errors import GrammarCompileCrash, GrammarCompileTimeout
from fd_guided.limits import AdmissionLimits
from fd_guided.registry import create_backend
from fd_guided.tokenizer import load_tokenizer

from isolated import run_isolated

pytestmark = pytest.mark.cpu

VOCAB = 129_280
# Lifts the admission bounds, so bombs reach the compilers and the budgets must stop them.
OPEN_LIMITS = AdmissionLimits(max_choices=10**6, max_constraint_bytes=10**8, max_ref_depth=10**6, max_repetition=10**8)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("deepseek")


def service_for(tokenizer, backend="auto", **config):
    config = GuidedConfig(backend=backend, limits=OPEN_LIMITS, **config)
    return CompileService(create_backend(backend, tokenizer, vocab_size=VOCAB, config=config))


def choices(count: int, salt: str) -> dict:
    return {"guided_choice": [f"{salt}{i}x{i * 7919 % 100003}" for i in range(count)]}


def spec_of(fields, backend="auto"):
    return parse_guided_request(fields, GuidedConfig(backend=backend, limits=OPEN_LIMITS))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed worker is reaped by its zygote; until then it is a zombie, which is gone for our purpose.
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().split(")")[-1].split()[0] != "Z"


def test_a_timed_out_compile_is_killed_and_its_cpu_comes_back(tokenizer):
    service = service_for(tokenizer, "xgrammar", compile_timeout_s=1.0)
    try:
        service.compile_now(spec_of({"guided_regex": "[a-z]+"}, "xgrammar"))  # workers up
        ticket = service.submit(spec_of(choices(20_000, "t"), "xgrammar"))
        time.sleep(0.3)
        busy = [pid for pid in service._runner.worker_pids() if alive(pid)]
        with pytest.raises(GrammarCompileTimeout, match="budget"):
            ticket.result(timeout=30)
        assert isinstance(ticket.exception(), InvalidGrammarError)  # a server's HTTP 400
        deadline = time.monotonic() + 5  # replaced and reaped by its zygote; on a loaded host not within 0.2 s
        while True:
            killed = [pid for pid in busy if pid not in service._runner.worker_pids()]
            if time.monotonic() > deadline or killed and not any(alive(pid) for pid in killed):
                break
            time.sleep(0.05)
        assert killed and not any(alive(pid) for pid in killed)
        assert service.metrics.labelled("compile_worker_events_total").get("killed_timeout") == 1
        assert service.compile_now(spec_of({"guided_regex": "[0-9]+"}, "xgrammar")).backend_name == "xgrammar"
    finally:
        service.close()


def test_a_compile_over_its_memory_budget_is_killed(tokenizer):
    service = service_for(tokenizer, "xgrammar", compile_memory_limit_bytes=32 << 20)
    try:
        with pytest.raises(InvalidGrammarError, match="memory budget"):
            service.compile_now(spec_of(choices(20_000, "m"), "xgrammar"))
        assert service.metrics.labelled("compile_worker_events_total").get("killed_memory") == 1
    finally:
        service.close()


def test_compile_workers_run_below_the_serving_process(tokenizer):
    service = service_for(tokenizer, "xgrammar", compile_nice=7)
    try:
        service.compile_now(spec_of({"guided_regex": "[a-z]+"}, "xgrammar"))
        pids = service._runner.worker_pids()
        assert pids and {os.getpriority(os.PRIO_PROCESS, pid) for pid in pids} == {7}
        assert os.getpriority(os.PRIO_PROCESS, 0) == 0  # the serving process keeps its priority
    finally:
        service.close()


def test_a_slow_compile_is_demoted_to_the_lowest_cpu_priority(tokenizer):
    service = service_for(tokenizer, "xgrammar", compile_demote_after_s=0.2)
    try:
        service.compile_now(spec_of({"guided_regex": "[a-z]+"}, "xgrammar"))
        ticket = service.submit(spec_of(choices(20_000, "d"), "xgrammar"))
        deadline = time.monotonic() + 5
        niceness = []
        while time.monotonic() < deadline and not ticket.done() and 19 not in niceness:
            niceness = [os.getpriority(os.PRIO_PROCESS, pid) for pid in service._runner.worker_pids() if alive(pid)]
            time.sleep(0.05)
        assert 19 in niceness
        assert service.metrics.labelled("compile_worker_events_total").get("demoted", 0) >= 1
    finally:
        service.close()


def test_a_good_request_behind_four_bombs_compiles_in_its_own_time(tokenizer):
    service = service_for(tokenizer, "auto", compile_timeout_s=8.0)
    try:
        service.compile_now(spec_of({"guided_regex": "[a-z]+"}))
        bombs = [service.submit(spec_of(choices(20_000, f"b{i}"))) for i in range(4)]
        time.sleep(0.05)
        started = time.monotonic()
        good = service.submit(spec_of({"guided_json": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}}))
        good.result(timeout=30)
        elapsed = time.monotonic() - started
        pending = [bomb for bomb in bombs if not bomb.done()]
        assert len(pending) == 4, f"the good request waited for {4 - len(pending)} bombs ({elapsed:.2f} s)"
    finally:
        started = time.monotonic()
        service.close()
        assert time.monotonic() - started < 3  # close() kills the bombs; it does not wait for them
    assert all(bomb.done() for bomb in bombs)


def test_close_returns_at_once_and_leaves_no_worker(tokenizer):
    service = service_for(tokenizer, "xgrammar")
    service.compile_now(spec_of({"guided_regex": "[a-z]+"}, "xgrammar"))
    ticket = service.submit(spec_of(choices(20_000, "c"), "xgrammar"))
    time.sleep(0.2)
    pids = service._runner.worker_pids()
    started = time.monotonic()
    service.close()
    assert time.monotonic() - started < 3
    with pytest.raises(Exception):
        ticket.result(timeout=5)
    time.sleep(0.3)
    assert pids and not any(alive(pid) for pid in pids)


def test_interpreter_exit_does_not_wait_for_a_compile_and_leaves_no_worker():
    result = run_isolated("""
        import json, time
        from fd_guided import GuidedConfig, parse_guided_request, load_tokenizer
        from fd_guided.compile import CompileService
        from fd_guided.limits import AdmissionLimits
        from fd_guided.registry import create_backend
        config = GuidedConfig(backend="xgrammar", limits=AdmissionLimits(max_choices=10**6), compile_timeout_s=60)
        service = CompileService(create_backend("xgrammar", load_tokenizer("deepseek"), vocab_size=129280, config=config))
        service.compile_now(parse_guided_request({"guided_regex": "[a-z]+"}, config))
        service.submit(parse_guided_request({"guided_choice": [f"w{i}q{i*31}" for i in range(20000)]}, config))
        time.sleep(0.3)
        from fd_guided.compile.pool import _zygotes
        pids = service._runner.worker_pids() + [z.process.pid for z in _zygotes.values()]
        print(json.dumps({"pids": pids, "exiting_at": time.time()}), flush=True)
    """, timeout_s=120)
    exited = time.time() - result["exiting_at"]
    assert exited < 20  # the 60 s compile did not hold the interpreter
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(pid) for pid in result["pids"]):
        time.sleep(0.1)
    assert not any(alive(pid) for pid in result["pids"])


def test_interpreter_exit_waits_for_a_running_compile_in_thread_isolation(tmp_path):
    # A compile past its budget runs on in thread isolation. If the interpreter finalized while it
    # ran, its return (retaking the GIL) killed the thread inside xgrammar's C++ frames: std::terminate,
    # "terminate called without an active exception", an abort at exit. Exit now waits for it.
    marker = tmp_path / "returned"
    result = run_isolated(f"""
        import json, time
        from fd_guided import GuidedConfig, parse_guided_request, load_tokenizer
        from fd_guided.compile import CompileService
        from fd_guided.errors import GrammarCompileTimeout
        from fd_guided.limits import AdmissionLimits
        from fd_guided.registry import create_backend
        config = GuidedConfig(backend="xgrammar", limits=AdmissionLimits(max_choices=10**6), compile_isolation="thread",
                              compile_timeout_s=0.3)
        service = CompileService(create_backend("xgrammar", load_tokenizer("deepseek"), vocab_size=129280, config=config))
        from fd_guided.backends import composite
        engine = composite.engine(service._runner.backend, "xgrammar")
        original = engine.compile_checked
        def compile_and_mark(spec):
            compiled = original(spec)
            open({str(marker)!r}, "w").write("returned")
            return compiled
        engine.compile_checked = compile_and_mark
        service.compile_now(parse_guided_request({{"guided_regex": "[a-z]+"}}, config))
        import os; os.remove({str(marker)!r})
        try:
            service.compile_now(parse_guided_request({{"guided_choice": [f"w{{i}}q{{i*31}}" for i in range(20000)]}}, config))
        except GrammarCompileTimeout:
            pass
        print(json.dumps({{"running_at_exit": not os.path.exists({str(marker)!r})}}), flush=True)
    """, timeout_s=180)
    assert result["running_at_exit"]  # the case is real: the compile was still running when exit began
    assert marker.read_text() == "returned"  # and exit waited for it (rc 0 checked by run_isolated)


def test_a_compiler_crash_costs_only_its_request():
    # 3,000 chained Lark rules overflow llguidance's native stack (a segfault). With the admission
    # bound lifted the grammar reaches the compiler: its worker dies, the request gets a typed
    # error, and the service goes on compiling in fresh workers.
    result = run_isolated("""
        import json
        from fd_guided import GuidedConfig, InvalidGrammarError, parse_guided_request, load_tokenizer
        from fd_guided.compile import CompileService
        from fd_guided.limits import AdmissionLimits
        from fd_guided.registry import create_backend
        config = GuidedConfig(backend="llguidance", limits=AdmissionLimits(max_rule_depth=10**6))
        service = CompileService(create_backend("llguidance", load_tokenizer("deepseek"), vocab_size=129280, config=config))
        chain = "start: r0\\n" + "".join(f"r{i}: r{i + 1}\\n" for i in range(5000)) + "r5000: /ab+/\\n"
        bomb = parse_guided_request({"guided_grammar": chain}, config)
        try:
            service.compile_now(bomb)
            outcome = "compiled"
        except InvalidGrammarError as error:
            outcome = type(error).__name__
        after = service.compile_now(parse_guided_request({"guided_regex": "[a-z]+"}, config)).backend_name
        events = service.metrics.labelled("compile_worker_events_total")
        service.close()
        print(json.dumps({"outcome": outcome, "after": after, "crashed": events.get("crashed", 0)}))
    """)
    assert result == {"outcome": "GrammarCompileCrash", "after": "llguidance", "crashed": 1}


def test_auto_falls_back_to_llguidance_when_xgrammar_fails_to_compile(tokenizer):
    service = service_for(tokenizer, "auto", auto_first_ready=False)
    try:
        # Passes both admission checks, but xgrammar's own compiler refuses the normalised `else`
        # branch ("minProperties is greater than the number of properties"): llguidance serves it.
        schema = {"type": "object", "properties": {"a": {}, "b": {}}, "if": {"required": ["a"]}, "else": {"minProperties": 2}}
        spec = spec_of({"guided_json": schema})
        assert service.backend.compile_engines(spec)[0] == "xgrammar"
        assert service.compile_now(spec).backend_name == "llguidance"
    finally:
        service.close()


def test_auto_starts_on_the_first_engine_ready_and_caches_xgrammar_for_next_time(tokenizer):
    service = service_for(tokenizer, "auto", auto_fallback_grace_s=0.05, compile_timeout_s=120)
    try:
        spec = spec_of(choices(10_000, "f"))
        first = service.compile_now(spec)
        assert first.backend_name == "llguidance"  # ~0.7 s, while xgrammar needs ~2 s
        deadline = time.monotonic() + 60
        while service.cache.get(("xgrammar", spec)) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert service.compile_now(spec).backend_name == "xgrammar"
        assert service.metrics.labelled("auto_served_by_total") == {"llguidance": 1}
    finally:
        service.close()


def scheduling_of(service, engine: str, settled=lambda policy, nice: True, timeout_s: float = 10.0):
    """(policy, niceness) of the worker running `engine`'s job, once one runs it and `settled`
    holds (the pool lowers a worker asynchronously, after its job started); the last seen else."""
    deadline, seen = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        for pid, worker in list(service._runner._workers.items()):
            if worker.job is not None and worker.job.engine == engine:
                try:
                    seen = os.sched_getscheduler(pid), os.getpriority(os.PRIO_PROCESS, pid)
                except OSError:
                    continue
                if settled(*seen):
                    return seen
        time.sleep(0.02)
    if seen is None:
        raise AssertionError(f"no {engine} job ran within {timeout_s} s")
    return seen


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="the idle CPU class is Linux's")
@pytest.mark.parametrize("idle_class", [True, False])
def test_a_cache_only_compile_runs_in_the_idle_cpu_class(tokenizer, idle_class):
    # auto serves this from llguidance at once; xgrammar's job (seconds) then only fills the cache:
    # nobody waits for it, so it must not compete with the serving process for a core.
    service = service_for(tokenizer, "auto", auto_fallback_grace_s=0.05, compile_timeout_s=120,
                          background_idle_class=idle_class)
    try:
        assert service.compile_now(spec_of(choices(10_000, "idle"))).backend_name == "llguidance"
        policy, nice = scheduling_of(service, "xgrammar",
                                     lambda policy, nice: policy == os.SCHED_IDLE or nice == 19)
        if idle_class:
            assert policy == os.SCHED_IDLE
        else:
            assert policy == os.SCHED_OTHER and nice == 19
    finally:
        service.close()


def test_a_burst_of_cold_auto_requests_is_served_by_the_cheap_engine_before_the_cache_fills(tokenizer):
    # One worker, twelve cold schemas at once: every llguidance job (milliseconds) is queued
    # before any xgrammar job (which only fills the cache), so the tickets do not wait for
    # xgrammar compiles of other requests. FIFO interleaving served them by xgrammar, one
    # xgrammar compile later each.
    service = service_for(tokenizer, "auto", compile_workers=1, auto_fallback_grace_s=0.0, compile_timeout_s=120)
    try:
        specs = [spec_of(choices(2_000, f"burst{i}-")) for i in range(12)]
        tickets = [service.submit(spec) for spec in specs]
        served = [ticket.result(timeout=120).backend_name for ticket in tickets]
        assert served.count("llguidance") >= len(specs) - 1, served
    finally:
        service.close()


def test_cache_only_compiles_are_a_bounded_backlog(tokenizer):
    # Every ticket is served by llguidance; the xgrammar jobs only fill the cache and, with
    # cheaper jobs first, would queue without bound under a stream of distinct schemas (the
    # soak grew RSS by 84 KB per schema). Beyond max_background_compiles the oldest are dropped;
    # nothing is remembered as an error, and the constraint still compiles on request.
    service = service_for(tokenizer, "auto", compile_workers=1, auto_fallback_grace_s=0.0, max_background_compiles=4,
                          compile_timeout_s=120)
    try:
        specs = [spec_of(choices(2_000, f"stream{i}-")) for i in range(24)]
        for start in range(0, len(specs), 4):
            tickets = [service.submit(spec) for spec in specs[start:start + 4]]
            assert all(t.result(timeout=120) is not None for t in tickets)
        with service._lock:
            assert len(service._background) <= 4
        assert service.metrics.value("background_compiles_dropped_total") >= 8
        deadline = time.monotonic() + 60
        while service.metrics.value("compiles_in_flight") > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert service.metrics.value("compiles_in_flight") == 0
        assert service.metrics.value("compile_errors_total") == 0
        with service._lock:
            assert not service._runs and not service._skipped and not service._jobs
        dropped = next(spec for spec in specs if service.cache.get(("xgrammar", spec)) is None)
        assert service.errors.get(("xgrammar", dropped)) is None
        assert service.compile_now(dropped).backend_name == "llguidance"  # cached; xgrammar compiles again
        deadline = time.monotonic() + 60
        while service.cache.get(("xgrammar", dropped)) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert service.compile_now(dropped).backend_name == "xgrammar"
    finally:
        service.close()


@pytest.mark.parametrize("fields", [
    {"guided_json": {"$ref": "#"}},
    {"guided_json": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}},
    {"guided_json": {"type": "integer", "minimum": 5, "maximum": 4}},
], ids=["self-ref", "ref-cycle", "empty-range"])
def test_unsatisfiable_constraints_are_invalid_grammar_errors(tokenizer, fields):
    service = service_for(tokenizer, "auto")
    try:
        with pytest.raises(InvalidGrammarError, match="unsatisfiable|greater than|admits no value") as caught:
            service.compile_now(spec_of(fields))
        assert caught.value.feature is None  # a request error, not a missing feature
    finally:
        service.close()


def test_one_engines_false_unsatisfiable_verdict_falls_back(tokenizer):
    # xgrammar's number grammar admits nothing here, yet 0.10000005 is valid: llguidance serves it.
    service = service_for(tokenizer, "auto")
    try:
        spec = spec_of({"guided_json": {"type": "number", "exclusiveMinimum": 0.1, "maximum": 0.1000001}})
        assert service.compile_now(spec).backend_name == "llguidance"
    finally:
        service.close()


def test_thread_isolation_still_compiles_and_times_out(tokenizer):
    service = service_for(tokenizer, "xgrammar", compile_isolation="thread", compile_timeout_s=0.5)
    try:
        assert service.isolation == "thread"
        assert service.compile_now(spec_of({"guided_regex": "[a-z]+"}, "xgrammar")).backend_name == "xgrammar"
        with pytest.raises(GrammarCompileTimeout):
            service.compile_now(spec_of(choices(20_000, "th"), "xgrammar"))
    finally:
        service.close()


def test_a_crash_error_type_is_an_invalid_grammar_error():
    assert issubclass(GrammarCompileCrash, InvalidGrammarError) and issubclass(GrammarCompileTimeout, InvalidGrammarError)


def test_a_zygote_that_cannot_start_fails_its_jobs_naming_why_and_the_pool_goes_on():
    """A zygote whose backend cannot be built fails every pending job with its own reason (not
    "None"), and the pool's loop survives it: a later job fails the same way instead of hanging."""
    from fd_guided.compile.pool import CompileProcessPool
    from fd_guided.compile.zygote import zygote_key

    recipe = ("fd_guided_no_such_module:factory", {})
    pool = CompileProcessPool(
        zygote_key(recipe), recipe, GuidedConfig(), max_workers=1, timeout_s=30,
        memory_limit_bytes=1 << 30, demote_after_s=5,
    )
    try:
        for _ in range(2):
            future = pool.submit("llguidance", parse_guided_request({"guided_regex": "a+"}))
            with pytest.raises(InvalidGrammarError) as caught:
                future.result(timeout=120)
            message = str(caught.value)
            assert "the compile workers could not start" in message and "None" not in message
            assert "fd_guided_no_such_module" in message
    finally:
        pool.close()


def test_a_checks_job_past_the_demotion_time_keeps_its_priority(tokenizer):
    """A `composite.CHECKS` job gates its request and its refusal names the feature: demoted to
    niceness 19 among other nice-19 work it could run past the compile budget and fail naming the
    budget instead. It runs past `compile_demote_after_s` here, at full priority, not demoted."""
    from fd_guided.backends.composite import CHECKS

    service = service_for(tokenizer, "auto", compile_demote_after_s=0.02)
    properties = {f"p{i}": {"type": "string", "pattern": f"^a{i}[0-9]+$"} for i in range(900)}
    either = [{"type": "integer"}, {"type": "string"}]
    properties.update({f"q{i}": {"anyOf": either} for i in range(3000)})
    spec = spec_of({"guided_json": {"type": "object", "properties": properties}})
    try:
        pool = service._runner
        started = time.monotonic()
        job = pool.submit(CHECKS, spec)
        niceness = []
        while not job.done():
            niceness += [os.getpriority(os.PRIO_PROCESS, pid) for pid in pool.worker_pids() if alive(pid)]
            time.sleep(0.01)
        job.exception(timeout=0)  # its verdict, whichever, came back from an undemoted worker
        assert time.monotonic() - started > 0.2  # well past the demotion time
        assert service.metrics.labelled("compile_worker_events_total").get("demoted", 0) == 0
        if os.getpriority(os.PRIO_PROCESS, 0) < 19:  # under nice 19 already: demotion would not show
            assert 19 not in niceness
    finally:
        service.close()
