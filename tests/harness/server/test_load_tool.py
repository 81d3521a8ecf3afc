"""tools/load.py's inputs: its cold schemas are valid, distinct, admitted by the default backend;
it refuses non-loopback targets."""

import pytest
from tool_modules import import_tool

from fd_guided import GuidedConfig, parse_guided_request

pytestmark = pytest.mark.cpu


@pytest.fixture(scope="module")
def load_tool():
    return import_tool("load")


def test_cold_schemas_are_admitted_and_distinct(load_tool):
    specs = {
        parse_guided_request(
            {"response_format": load_tool.response_format(load_tool.complex_schema(i), "x")},
            GuidedConfig(backend="auto"),
        )
        for i in range(64)
    }
    assert len(specs) == 64


def test_only_loopback_targets(load_tool):
    load_tool.check_loopback("http://127.0.0.1:8000")
    with pytest.raises(SystemExit):
        load_tool.check_loopback("http://10.0.0.1:8000")


def test_comparison_pools_each_servers_rounds_and_gives_ratios(load_tool):
    def run(server, round_index, ttfts):
        samples = {"background:ttft": ttfts, "background:tpot": [0.01] * len(ttfts)}
        summary = {
            "ttft": {"background": load_tool.percentiles(ttfts)},
            "tpot": {"background": load_tool.percentiles(samples["background:tpot"])},
        }
        return {"server": server, "round": round_index, "phases": {"guided": {"samples": samples, **summary}}}

    runs = [
        run("two", 0, [1.0, 2.0, 3.0]),
        run("one", 0, [2.0, 4.0, 6.0]),
        run("two", 1, [1.0, 1.0, 1.0]),
        run("one", 1, [1.0, 1.0, 1.0]),
    ]
    entry = load_tool.comparison(runs, ["two", "one"])["guided:background:ttft"]
    assert entry["servers"]["two"]["count"] == 6 and entry["servers"]["two"]["p50"] == 1.0  # 1, 1, 1, 1, 2, 3
    assert entry["servers"]["one"]["p50"] == 1.0 and entry["servers"]["one"]["max"] == 6.0
    assert entry["two/one"]["p99"] == 0.5  # 3 / 6
    assert entry["two/one per round (p50)"] == [0.5, 1.0]
    assert "guided:burst:ttft" in load_tool.comparison(runs, ["two", "one"])  # a kind neither ran: no ratio
    assert "two/one" not in load_tool.comparison(runs, ["two", "one"])["guided:burst:ttft"]
