"""tools/load.py's inputs: its cold schemas are valid, distinct, admitted by the default backend;
it refuses non-loopback targets."""
import importlib.util
import os
import sys

import pytest

from fd_guided import GuidedConfig, parse_guided_request

pytestmark = pytest.mark.cpu

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tools", "load.py")


@pytest.fixture(scope="module")
def load_tool():
    spec = importlib.util.spec_from_file_location("fd_guided_load_tool", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_cold_schemas_are_admitted_and_distinct(load_tool):
    specs = {parse_guided_request({"response_format": load_tool.response_format(load_tool.complex_schema(i), "x")},
                                  GuidedConfig(backend="auto")) for i in range(64)}
    assert len(specs) == 64


def test_only_loopback_targets(load_tool):
    load_tool.check_loopback("http://127.0.0.1:8000")
    with pytest.raises(SystemExit):
        load_tool.check_loopback("http://10.0.0.1:8000")
