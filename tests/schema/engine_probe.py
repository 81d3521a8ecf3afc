"""Real matchers over a byte tokenizer, for tests that feed exact JSON text (no mocks)."""
from __future__ import annotations

import functools
import json

import jsonschema

from fd_guided import GuidedConfig, parse_guided_request
from fd_guided.harness.conformance import STOP, byte_tokenizer
from fd_guided.registry import get_backend_class

ENGINES = ("xgrammar", "llguidance")


@functools.lru_cache(maxsize=None)
def backend(name: str):
    return get_backend_class(name)(byte_tokenizer(), vocab_size=STOP + 1, config=GuidedConfig(backend=name), stop_token_ids=[STOP])


def spec_for(engine: str, schema, **fields):
    """Admission through `engine`'s own checker (compact JSON unless fields say otherwise)."""
    return parse_guided_request({"guided_json": schema, "disable_any_whitespace": True, **fields}, GuidedConfig(backend=engine))


def accepts(engine: str, spec, text: str) -> bool:
    """Feed `text` byte by byte to a fresh matcher, then a stop token: is it a complete match?"""
    engine_backend = backend(engine)
    grammar = engine_backend.new_grammar(engine_backend.compile(spec))
    return all(grammar.accept_token(b) for b in text.encode("utf-8")) and grammar.accept_token(STOP) and grammar.is_terminated()


def compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def valid(schema, value) -> bool:
    """The independent judge: jsonschema (2020-12) with format checking."""
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER).is_valid(value)
