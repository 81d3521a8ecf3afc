"""Shared pytest wiring: the `--require-cuda` switch and the CUDA skip rule."""
import functools

import pytest


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


def pytest_runtest_setup(item):
    if "cuda" not in item.keywords or cuda_available():
        return
    if item.config.getoption("--require-cuda"):
        pytest.fail("--require-cuda was given but torch.cuda.is_available() is False")
    pytest.skip("needs a CUDA device (torch.cuda.is_available() is False)")
