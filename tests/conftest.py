"""Shared pytest wiring: the `--require-cuda` switch, the CUDA skip rule, the FastDeploy skip rule.

Tests marked `fastdeploy` run real FastDeploy (tests/fastdeploy_host.py); they skip, with the
reason, where the snapshot or FastDeploy's dependencies are missing (e.g. the main test venv,
whose numpy 2 FastDeploy's paddleformers refuses). `.ci/run` runs them in their own venv.
"""
import functools
import os

import pytest

# Admission decides every verdict inline in tests (`GuidedConfig.admission_budget_s`): a time
# budget would make verdicts depend on the machine's load. Tests of the bounded admission set
# the budget themselves (tests/admission/test_bounded_admission.py).
os.environ.setdefault("FD_GUIDED_ADMISSION_BUDGET_MS", "inline")


@pytest.fixture
def fresh_admission_caches():
    """Empty admission's caches (parsed texts, checked verdicts) before and after a test, so a
    verdict one test caches is never what another test reads. Modules whose tests depend on it use
    `pytestmark = [..., pytest.mark.usefixtures("fresh_admission_caches")]`."""
    from fd_guided.admission import cache

    for verdicts in (cache.PARSED, cache.CHECKED, cache.NULL_PLACES):
        verdicts.clear()
    yield
    for verdicts in (cache.PARSED, cache.CHECKED, cache.NULL_PLACES):
        verdicts.clear()


def pytest_addoption(parser):
    parser.addoption(
        "--require-cuda",
        action="store_true",
        default=False,
        help="fail, instead of skipping, cuda-marked tests when no CUDA device is usable",
    )


@functools.lru_cache(maxsize=1)
def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@functools.lru_cache(maxsize=1)
def fastdeploy_unavailable() -> str | None:
    from fastdeploy_host import unavailable_reason

    return unavailable_reason()


def pytest_runtest_setup(item):
    # The marker, not item.keywords: keywords hold directory names too, so every test under
    # tests/integrations/fastdeploy/ (the CPU adapter tests included) would skip in the main venv.
    if item.get_closest_marker("fastdeploy") is not None and fastdeploy_unavailable():
        pytest.skip(fastdeploy_unavailable())
    if "cuda" not in item.keywords or cuda_available():
        return
    if item.config.getoption("--require-cuda"):
        pytest.fail("--require-cuda was given but torch.cuda.is_available() is False")
    pytest.skip("needs a CUDA device (torch.cuda.is_available() is False)")
