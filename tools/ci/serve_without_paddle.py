"""Prove the core install serves guided decoding on a host without Paddle (run in such a venv).

    python tools/ci/serve_without_paddle.py

A torch-only host: a byte-level tokenizer built in place (no tokenizer package), each engine
(xgrammar, llguidance, auto) through `GuidedDecodingManager`, compiles in the worker processes,
torch CPU logits masked in place by the CPU kernel, a greedy decode of a batch of JSON-schema,
regex and choice requests, every output checked (jsonschema, re.fullmatch, membership). Exits
non-zero with the reason on any failure, or when Paddle is importable at all.
"""
from __future__ import annotations

import importlib.util
import json
import re
import sys

import jsonschema
import torch

from fd_guided import GuidedConfig, GuidedDecodingManager, create_backend
from fd_guided.kernels import cpu as cpu_kernel
from fd_guided.tokenizer import ByteEncoder, TokenizerBundle, join_token_bytes

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "ok", "n"], "additionalProperties": False}
REQUESTS = [({"guided_json": SCHEMA}, lambda text: jsonschema.validate(json.loads(text), SCHEMA)),
            ({"guided_regex": r"[a-z]{2,5}@[a-z]{2,4}\.com"}, lambda text: _must(re.fullmatch(r"[a-z]{2,5}@[a-z]{2,4}\.com", text))),
            ({"guided_choice": ["yes", "no", "maybe"]}, lambda text: _must(text in ("yes", "no", "maybe")))]
MAX_STEPS = 200


def _must(condition) -> None:
    if not condition:
        raise AssertionError("output does not match")


def byte_tokenizer() -> TokenizerBundle:
    """256 single bytes, a few multi-byte pieces, and an EOS: enough for every constraint here."""
    pieces = [bytes([b]) for b in range(256)] + [b'{"', b'":', b'",', b'true', b'false', b'name', b'.com', b'yes']
    token_bytes = tuple(pieces) + (None,)
    return TokenizerBundle(name="bytes", token_bytes=token_bytes, eos_token_ids=(len(token_bytes) - 1,),
                           encode=ByteEncoder(token_bytes), decode_bytes=lambda ids: join_token_bytes(token_bytes, ids))


def decode(backend_name: str, tokenizer: TokenizerBundle) -> None:
    config = GuidedConfig(backend=backend_name)
    backend = create_backend(backend_name, tokenizer, vocab_size=tokenizer.vocab_size, config=config)
    manager = GuidedDecodingManager(backend, max_num_seqs=len(REQUESTS), kernel_impl="cpu")
    try:
        for slot, (fields, _) in enumerate(REQUESTS):
            manager.add_request(slot, manager.validate(fields), prefill_done=True)
        if not manager.wait_ready(list(range(len(REQUESTS))), timeout_s=120):
            raise AssertionError(f"{backend_name}: grammars not ready in 120 s")
        generator = torch.Generator().manual_seed(0)
        outputs: dict[int, list[int]] = {slot: [] for slot in range(len(REQUESTS))}
        live = set(outputs)
        for _ in range(MAX_STEPS):
            rows = sorted(live)
            manager.begin_step(rows)
            logits = torch.randn(len(rows), tokenizer.vocab_size, generator=generator)
            manager.apply(logits)
            tokens = logits.argmax(dim=-1).tolist()
            for slot, token in zip(rows, tokens):
                if token not in tokenizer.eos_token_ids:
                    outputs[slot].append(token)
            for finish in manager.accept(tokens):
                if finish.reason != "stop":
                    raise AssertionError(f"{backend_name}: slot {finish.slot} ended {finish.reason}: {finish.error}")
                live.discard(finish.slot)
            for slot, token in zip(rows, tokens):
                if token in tokenizer.eos_token_ids:
                    live.discard(slot)
            if not live:
                break
        if live:
            raise AssertionError(f"{backend_name}: slots {sorted(live)} unfinished after {MAX_STEPS} steps")
        for slot, (fields, check) in enumerate(REQUESTS):
            text = tokenizer.decode(outputs[slot])
            check(text)
            print(f"  {backend_name:10} {next(iter(fields))}: {text}")
    finally:
        manager.close()


def main() -> int:
    if importlib.util.find_spec("paddle") is not None:
        print("FAIL: paddle is importable here; this proof needs a venv without it", file=sys.stderr)
        return 1
    if not cpu_kernel.FAST_PATH_AVAILABLE:
        print("FAIL: the CPU mask kernel (C extension) was not built", file=sys.stderr)
        return 1
    tokenizer = byte_tokenizer()
    for name in ("xgrammar", "llguidance", "auto"):
        decode(name, tokenizer)
    if "paddle" in sys.modules:
        print("FAIL: something imported paddle", file=sys.stderr)
        return 1
    print("OK: the core served a guided batch with xgrammar, llguidance and auto, without Paddle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
