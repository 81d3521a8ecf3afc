"""Small helpers shared by tests: admission plus compile as one verdict, and ready managers."""
from __future__ import annotations

import functools

from fd_guided import GuidedConfig, parse_guided_request
from fd_guided.registry import create_backend
from fd_guided.tokenizer import load_tokenizer

VOCAB = 129_280


@functools.lru_cache(maxsize=4)
def in_process_backend(name: str):
    """A backend compiling in this process (benign inputs only: hostile ones go through workers)."""
    return create_backend(name, load_tokenizer("deepseek"), vocab_size=VOCAB, config=GuidedConfig(backend=name))


def admit_and_compile(fields: dict, backend: str = "auto", config: GuidedConfig | None = None):
    """Admission, then the compile a worker would run: raises the InvalidGrammarError a client
    gets at either stage (syntax only a compiler can judge fails at the second)."""
    config = config or GuidedConfig(backend=backend)
    spec = parse_guided_request(fields, config)
    return in_process_backend(backend).compile_checked(spec)


def add_ready(manager, slot: int, spec, timeout_s: float = 120, **kwargs) -> None:
    """`add_request` and wait until the slot's grammar is ready (what a host's scheduler does)."""
    manager.add_request(slot, spec, **kwargs)
    assert manager.wait_ready([slot], timeout_s=timeout_s), f"slot {slot} was not ready in {timeout_s} s"
