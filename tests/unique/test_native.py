"""The guard's C candidate loop (`fd_guided.unique.native`) against the Python reference, bit for bit.

Each case runs in a subprocess (tests/isolated.py): native code that crashes fails its test only.
  - the adversarial guard tests (tests/unique/test_unique_guard.py) re-run with every natively decided row
    decided by the reference too (tests/unique/native_shadow.py);
  - random documents (arrays of similar strings, prefixes, escapes, multi-byte characters, nested
    and enclosing arrays, whitespace) walked token by token on xgrammar: at every step the full row
    is restricted both ways from the same engine bits.
"""
import pytest
from isolated import REPO, run_isolated

pytestmark = pytest.mark.cpu


def test_the_extension_is_built():
    from fd_guided.unique import native

    assert native.AVAILABLE, "fd_guided.unique._native missing: pip install -e . (a C compiler is needed)"


def test_native_matches_the_reference_over_the_adversarial_guard_tests():
    result = run_isolated(f"""
        import subprocess, sys, json
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                               "-p", "tests.unique.native_shadow", "tests/unique/test_unique_guard.py"],
                              capture_output=True, text=True, cwd={str(REPO)!r})
        stats = [line for line in done.stdout.splitlines() if line.startswith('{{"rows"')]
        print(json.dumps({{"rc": done.returncode, "stats": json.loads(stats[-1]) if stats else None,
                           "tail": done.stdout[-3000:] + done.stderr[-2000:]}}))
    """, timeout_s=900)
    assert result["rc"] == 0, result["tail"]
    assert result["stats"]["mismatches"] == 0
    assert result["stats"]["rows"] >= 50, result["stats"]  # the C loop really ran on many rows


def test_native_matches_the_reference_on_random_documents():
    result = run_isolated("""
        import json, random
        import numpy as np, torch
        from fd_guided import GuidedConfig, parse_guided_request
        from fd_guided.registry import get_backend_class
        from fd_guided.tokenizer import load_tokenizer
        from fd_guided.unique import native

        rng = random.Random(7)
        tokenizer = load_tokenizer("deepseek")
        backend = get_backend_class("xgrammar")(tokenizer, vocab_size=tokenizer.padded_vocab_size,
                                                config=GuidedConfig(backend="xgrammar"))
        ALPHABET = ["a", "b", "ab", " ", "tag", "é", "日本", "\\"", "\\\\", "\\n", ",", "]", "x1", "😀"]

        def word():
            return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 4)))

        def strings(n):
            out = []
            while len(out) < n:
                base = rng.choice(out) if out and rng.random() < 0.6 else ""
                candidate = base + word() if rng.random() < 0.8 else word()
                if candidate not in out:
                    out.append(candidate)
            return out

        SCHEMAS = [
            {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
             "required": ["tags"]},
            {"type": "array", "items": {"type": "string", "pattern": "^[^,]+$"}, "uniqueItems": True},
            {"type": "array", "uniqueItems": True, "items": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
            {"type": "array", "items": {"type": ["string", "null"]}, "uniqueItems": True},
        ]
        rows = mismatches = native_rows = engine_refused = 0
        for case in range(40):
            schema = SCHEMAS[case % len(SCHEMAS)]
            items = strings(rng.randint(1, 7))
            if case % 5 == 2:
                items = [item.replace(",", "") or "z" for item in items]
                items = list(dict.fromkeys(items))
            if case % 5 == 3:
                value = [items[:k] for k in range(1, len(items) + 1)]
            elif case % 5 == 4:
                value = items + [None]
            else:
                value = items
            document = {"tags": value} if case % 5 == 1 else value
            text = json.dumps(document, ensure_ascii=rng.random() < 0.3, indent=rng.choice([None, None, 1]))
            grammar = backend.new_grammar(backend.compile(parse_guided_request({"guided_json": schema})))
            width = (backend.vocab_size + 31) // 32
            for token in tokenizer.encode(text):
                bits = torch.zeros((2, width), dtype=torch.int32)
                grammar.inner.fill_bitmask(bits, 0)
                bits[1] = bits[0]
                planned = native.row_plan(grammar.tracker) is not None
                native.ENABLED = True
                grammar.restrict(bits, 0)
                native.ENABLED = False
                grammar.restrict(bits, 1)
                native.ENABLED = True
                rows += 1
                native_rows += planned
                if not torch.equal(bits[0], bits[1]):
                    mismatches += 1
                    print("mismatch", case, repr(bytes(grammar.tracker.buffer)[-40:]))
                if not grammar.accept_token(token):
                    if grammar.inner.accept_token(token):  # the engine takes it, the guard does not
                        raise SystemExit(f"the guard refused a unique document: {text!r}")
                    engine_refused += 1  # (xgrammar's patterned strings take no escapes)
                    break
        backend.close()
        print(json.dumps({"rows": rows, "native_rows": native_rows, "mismatches": mismatches, "engine_refused": engine_refused}))
    """, timeout_s=900)
    assert result["mismatches"] == 0, result
    assert result["native_rows"] >= result["rows"] // 3, result
    assert result["engine_refused"] <= 8, result


def test_native_matches_the_reference_with_every_token_allowed():
    """No engine: the tracker is pushed into crafted states and the row allows every token, so every
    token of the candidate classes is decided both ways (split characters, invalid UTF-8 items,
    escapes, brackets with and without a guarded array around, languages that run out or not)."""
    result = run_isolated(r'''
        import json
        import numpy as np
        from fd_guided.interface import Grammar
        from fd_guided.schema.unique_paths import UniquePaths
        from fd_guided.tokenizer import load_tokenizer
        from fd_guided.unique import guard, native

        class NoEngine(Grammar):  # the states below never ask the engine (no object items)
            def accept_token(self, token_id): return True
            def fill_bitmask(self, bitmask, row): raise AssertionError("the engine was asked")
            def is_terminated(self): return False
            def rollback(self, num_tokens): pass
            def reset(self): pass

        tokenizer = load_tokenizer("deepseek")
        width = (len(tokenizer.token_bytes) + 31) // 32
        STRINGS = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
        cases = [
            (STRINGS, ['["ab', 'c", "a', 'b"', ', "ab']),
            (STRINGS, ['["tag', '", "tag ', 'x", ', '"t']),
            (STRINGS, ['["\xc3\xa9', '", "\xc3']),            # a character split across tokens
            (STRINGS, ['["\xff', '", "']),                     # an item that is not UTF-8
            (STRINGS, ['["a\\n', '", "b', '", ']),
            (STRINGS, ['["x", "y"', ' ']),
            ({"type": "object", "properties": {"t": STRINGS}}, ['{"t": ["a', '", "b', '", "']),
            ({"type": "array", "uniqueItems": True, "items": STRINGS}, ['[["a', '", "b"], ["a', '", "b']),
            ({**STRINGS, "items": {"type": "string", "pattern": "^[a-z]+$"}}, ['["ab', '", "a']),
            ({**STRINGS, "items": {"type": "string", "maxLength": 2}}, ['["ab', '", "a']),  # runs out: Python
            ({**STRINGS, "items": {"type": ["string", "null"]}}, ['["a', '", null, "']),
        ]
        compared = native_rows = 0
        for schema, chunks in cases:
            grammar = guard.UniqueItemsGrammar(NoEngine(), UniquePaths(schema), tokenizer.token_bytes, width * 32)
            for chunk in chunks:
                assert grammar.tracker.push(chunk.encode("latin-1") if "\xff" in chunk or "\xc3" in chunk else chunk.encode()), chunk
                bits = np.full((2, width), -1, dtype=np.int32)
                native.ENABLED = True
                native_rows += native.row_plan(grammar.tracker) is not None
                guard.restrict_rows([grammar], bits, [0])
                native.ENABLED = False
                guard.restrict_rows([grammar], bits, [1])
                native.ENABLED = True
                assert np.array_equal(bits[0], bits[1]), (schema, chunk, np.nonzero(bits[0] != bits[1])[0][:5])
                compared += 1
        print(json.dumps({"compared": compared, "states": sum(len(chunks) for _, chunks in cases), "native_rows": native_rows}))
    ''', timeout_s=600)
    assert result["compared"] == result["states"] and result["native_rows"] >= 20, result
