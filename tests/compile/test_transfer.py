"""How a worker's grammar reaches the serving process: its bytes, or a second compile here
(`fd_guided.compile.transfer`)."""

import json

import numpy as np
import pytest
import torch

from fd_guided import GuidedConfig, parse_guided_request
from fd_guided.compile import CompileService
from fd_guided.compile.transfer import LOAD_MEMORY_PER_BYTE, TRANSFER_S_PER_BYTE, compile_here
from fd_guided.registry import create_backend
from fd_guided.tokenizer import load_tokenizer

pytestmark = pytest.mark.cpu

VOCAB = 129_280
MB = 1 << 20


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("deepseek")


def patterned_schema(properties: int) -> str:
    """An object of patterned strings: xgrammar writes one copy of its character FSM per rule."""
    pattern = {"type": "string", "pattern": "^[a-z]{2,8}-[0-9]{3}$"}
    return json.dumps({"type": "object", "properties": {f"field_{i}": pattern for i in range(properties)}})


def xgrammar_spec(schema: str):
    return parse_guided_request({"guided_json": schema}, GuidedConfig(backend="xgrammar"))


def masks_along(backend, compiled, token_ids) -> list[np.ndarray]:
    """The grammar's masks at its start and after each of `token_ids`."""
    grammar = backend.new_grammar(compiled)
    bitmask = backend.allocate_bitmask(1)
    masks = []
    for token in [None, *token_ids]:
        if token is not None:
            assert grammar.accept_token(token)
        grammar.fill_bitmask(bitmask, 0)
        masks.append(torch.as_tensor(bitmask).numpy().copy())
    return masks


def test_the_rule_weighs_bytes_time_and_memory():
    assert not compile_here(None, 0.001, 0, 0)  # no estimate: the bytes are few
    assert not compile_here(1 << 30, 0.001, 0, None)  # the operator's choice: always the bytes
    assert compile_here(17 * MB, 60.0, 0, 16 * MB)  # past the bound, however slow the compile
    assert not compile_here(MB, 1.0, 0, 16 * MB)  # ~0.08 s to send against 1 s to compile again
    assert compile_here(MB, 0.01, 0, 16 * MB)  # sending takes several times the compile
    quick = 2 * MB * TRANSFER_S_PER_BYTE
    assert compile_here(2 * MB, quick / 3, 0, 16 * MB) and not compile_here(2 * MB, quick, 0, 16 * MB)
    # A compile that grew its worker more than loading its bytes would grow this process: send them.
    assert not compile_here(17 * MB, 0.01, LOAD_MEMORY_PER_BYTE * 17 * MB + 1, 16 * MB)


@pytest.mark.parametrize("properties", [1, 12, 24])
def test_the_xgrammar_estimate_is_near_the_written_size(tokenizer, properties):
    backend = create_backend("xgrammar", tokenizer, vocab_size=VOCAB, config=GuidedConfig(backend="xgrammar"))
    compiled = backend.compile(xgrammar_spec(patterned_schema(properties)))
    written = len(backend.serialize(compiled))
    assert 0.5 <= backend.serialized_size_estimate(compiled) / written <= 2.0


def test_a_grammar_past_the_bound_is_compiled_again_here_with_the_same_masks(tokenizer):
    config = GuidedConfig(backend="xgrammar", compile_transfer_max_bytes=MB)
    service = CompileService(create_backend("xgrammar", tokenizer, vocab_size=VOCAB, config=config))
    local = create_backend("xgrammar", tokenizer, vocab_size=VOCAB, config=config)
    spec = xgrammar_spec(patterned_schema(12))
    try:
        assert local.serialized_size_estimate(local.compile(spec)) > MB
        compiled = service.compile_now(spec)
        assert service.metrics.value("compiles_rebuilt_here_total") == 1
        assert str(compiled.native.grammar) == str(local.compile(spec).native.grammar)
        tokens = tokenizer.encode('{"field_3": "ab-123", "field_7": "xyz-')
        here, there = masks_along(local, compiled, tokens), masks_along(local, local.compile(spec), tokens)
        assert len(here) == len(there) == len(tokens) + 1
        assert all(np.array_equal(a, b) for a, b in zip(here, there))
        assert here[0].any() and not here[0].all()  # a mask that allows some tokens and not others
    finally:
        service.close()


def test_with_no_bound_the_worker_always_sends_its_bytes(tokenizer):
    config = GuidedConfig(backend="xgrammar", compile_transfer_max_bytes=None)
    service = CompileService(create_backend("xgrammar", tokenizer, vocab_size=VOCAB, config=config))
    try:
        compiled = service.compile_now(xgrammar_spec(patterned_schema(12)))
        assert compiled.backend_name == "xgrammar"
        assert service.metrics.value("compiles_rebuilt_here_total") == 0
    finally:
        service.close()


def test_llguidance_grammars_travel_as_bytes(tokenizer):
    config = GuidedConfig(backend="llguidance", compile_transfer_max_bytes=0)
    service = CompileService(create_backend("llguidance", tokenizer, vocab_size=VOCAB, config=config))
    try:
        compiled = service.compile_now(parse_guided_request({"guided_json": patterned_schema(12)}, config))
        assert compiled.backend_name == "llguidance"
        assert service.metrics.value("compiles_rebuilt_here_total") == 0
    finally:
        service.close()


class DictSharedCache:
    """A `SharedGrammarCache` in this process's memory (the L2 protocol, as Redis serves it)."""

    def __init__(self):
        self.puts = []

    def get(self, spec, backend):
        return None

    def put(self, spec, backend, data):
        self.puts.append(len(data))


@pytest.mark.parametrize("bound, stored", [(MB, 0), (64 * MB, 1)])
def test_the_shared_cache_is_not_given_what_was_not_sent(tokenizer, bound, stored):
    config = GuidedConfig(backend="xgrammar", compile_transfer_max_bytes=bound)
    shared = DictSharedCache()
    service = CompileService(
        create_backend("xgrammar", tokenizer, vocab_size=VOCAB, config=config), shared_cache=shared
    )
    try:
        service.compile_now(xgrammar_spec(patterned_schema(12)))
        assert len(shared.puts) == stored
    finally:
        service.close()


def test_the_transfer_cost_tool_compiles_each_schema_both_ways(tmp_path):
    from tool_modules import import_tool

    (tmp_path / "a.json").write_text(patterned_schema(12))
    (tmp_path / "b.json").write_text('{"type": "object", "properties": {"x": {"type": "integer"}}}')
    out = tmp_path / "out.json"
    assert import_tool("transfer_cost").main([str(tmp_path), "--sample", "2", "--timeout", "60", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {row["schema"] for row in result["rows"]} == {"a.json", "b.json"}
    for row in result["rows"]:
        assert row["send"]["outcome"] == row["rule"]["outcome"] == "compiled"
        assert not row["send"]["compiled_here"]
    assert result["summary"]["send"]["compiled"] == result["summary"]["rule"]["compiled"] == 2
