"""`Liveness`: the verdicts the watchdog acts on (the real engine process made to hang is in
test_engine_process.py); times are given, so each case is exact."""
import pytest

from fd_guided.harness.server.liveness import Liveness

pytestmark = pytest.mark.cpu


def looks(liveness: Liveness, start: float, end: float) -> list[str | None]:
    """The watchdog's verdicts, one look every `check_s` from `start` to `end`."""
    verdicts, now = [], start
    while now <= end + 1e-9:
        verdicts.append(liveness.verdict(now))
        now += liveness.check_s
    return verdicts


def test_heartbeats_keep_it_alive_and_silence_past_the_deadline_does_not():
    liveness = Liveness(silence_s=5.0, step_s=60.0, check_s=0.25)
    liveness.reset(100.0)
    for beat in range(1, 41):  # 4 s of heartbeats every 100 ms, looked at every 250 ms
        liveness.heard(100.0 + beat / 10, busy_since=0.0)
        if beat % 5 == 0:
            assert liveness.verdict(100.0 + beat / 10) is None
    verdicts = looks(liveness, 104.25, 109.5)
    first = next(i for i, v in enumerate(verdicts) if v is not None)
    assert 104.25 + first * 0.25 == pytest.approx(109.25)  # the first look past 5 s of silence
    assert verdicts[first].startswith("no message from it for 5.2 s (deadline 5 s)"), verdicts[first]


def test_a_step_running_past_its_deadline_is_stuck_even_with_heartbeats():
    liveness = Liveness(silence_s=5.0, step_s=60.0, check_s=0.25)
    liveness.reset(0.0)
    now, verdict = 0.0, None
    while verdict is None:  # heartbeats every look, all saying the engine thread began a step at 0.5 s
        now += 0.25
        liveness.heard(now, busy_since=0.5)
        verdict = liveness.verdict(now)
    assert now == pytest.approx(60.75)  # the first look more than 60 s after the step began
    assert verdict == "one engine step has run for 60.2 s (deadline 60 s)"
    liveness.heard(now + 0.25, busy_since=0.0)  # the step ended
    assert liveness.verdict(now + 0.25) is None


def test_a_late_watchdog_judges_nothing():
    """The API process itself stalled (stopped, starved) for longer than the deadline: the engine's
    messages may wait unread, so the look after the stall starts the count afresh."""
    liveness = Liveness(silence_s=5.0, step_s=60.0, check_s=0.25)
    liveness.reset(0.0)
    assert liveness.verdict(0.25) is None
    assert liveness.verdict(20.0) is None  # 19.75 s since the previous look: late
    assert liveness.verdict(20.25) is None
    verdicts = looks(liveness, 20.5, 26.0)
    assert verdicts.index(next(v for v in verdicts if v)) == pytest.approx((25.0 - 20.5) / 0.25), verdicts
