"""The guard's C side (`fd_guided.unique.native`) against the Python reference, bit for bit.

Each case runs in a subprocess (tests/isolated.py): native code that crashes fails its test only.
  - the adversarial guard tests (tests/unique/test_unique_guard.py) re-run with every row the C side
    decides decided by the reference too (tests/unique/native_shadow.py);
  - random documents (strings with shared prefixes, escapes and multi-byte characters; numbers;
    literals; any values; object items, with the open property last; nested and enclosing arrays;
    finite domains) walked token by token on xgrammar: at every step the full row is restricted
    both ways from the same engine bits;
  - crafted states where every token is allowed, so every candidate is decided both ways;
  - the canonical keys (`canon.c`) against `item_keys` on random pairs of JSON values;
  - hostile inputs: 10,000 items, deep nesting, long strings: no crash, bounded memory, same rows.
"""
import pytest
from isolated import REPO, run_isolated

pytestmark = pytest.mark.cpu

NO_ENGINE = '''
from fd_guided.interface import Grammar

class NoEngine(Grammar):  # allows every token (asked only where closing an object item would repeat one)
    def accept_token(self, token_id): return True
    def fill_bitmask(self, bitmask, row): bitmask[row] = -1
    def is_terminated(self): return False
    def rollback(self, num_tokens): pass
    def reset(self): pass


def push_and_compare(grammar, chunk, data, width):
    """Push `data` into the guard's tracker, then restrict an all-allowed row natively and by the
    Python reference; both rows must be equal, bit for bit. Returns 1 when the plan was native."""
    import numpy as np
    from fd_guided.unique import guard, native

    assert grammar.tracker.push(data), chunk
    grammar.tracker.fill_plan = grammar._make_plan()
    bits = np.full((2, width), -1, dtype=np.int32)
    native.ENABLED = True
    native_row = native.is_plan(grammar.tracker.fill_plan)
    guard.restrict_rows([grammar], bits, [0])
    native.ENABLED = False
    guard.restrict_rows([grammar], bits, [1])
    native.ENABLED = True
    assert np.array_equal(bits[0], bits[1]), (chunk, np.nonzero(bits[0] != bits[1])[0][:5])
    return native_row
'''


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
    stats = result["stats"]
    assert stats["mismatches"] == 0
    assert stats["rows"] >= 2000, stats  # the C side really decided many rows
    # inside object items (top frame "o") and in every scalar mode, not only string arrays
    assert stats["states"].get("o0", 0) >= 100 and stats["states"].get("a2", 0) >= 100, stats


def test_native_matches_the_reference_on_random_documents():
    result = run_isolated("""
        import json, random
        import numpy as np, torch
        from fd_guided import GuidedConfig, parse_guided_request
        from fd_guided.registry import get_backend_class
        from fd_guided.tokenizer import load_tokenizer
        from fd_guided.unique import native
        from fd_guided.unique.items import item_keys

        rng = random.Random(7)
        tokenizer = load_tokenizer("deepseek")
        backend = get_backend_class("xgrammar")(tokenizer, vocab_size=tokenizer.padded_vocab_size,
                                                config=GuidedConfig(backend="xgrammar"))
        ALPHABET = ["a", "b", "ab", " ", "tag", "é", "日本", '"', "\\\\", "\\n", ",", "]", "}", "x1", "😀"]

        def word():
            return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 3)))

        def scalar():
            pick = rng.random()
            if pick < 0.4:
                return word()
            if pick < 0.65:
                return rng.choice([0, 1, -1, 1.5, 10, 1e3, 2.0, 0.5, 100000000000000000000, -0.25])
            return rng.choice([True, False, None])

        def any_value(depth=0):
            pick = rng.random()
            if depth < 2 and pick < 0.2:
                return [any_value(depth + 1) for _ in range(rng.randint(0, 3))]
            if depth < 2 and pick < 0.4:
                return {rng.choice(["a", "b", "é"]): any_value(depth + 1) for _ in range(rng.randint(0, 3))}
            return scalar()

        def unique(make, n):
            out, seen = [], set()
            for _ in range(40):
                value = make()
                keys = item_keys(json.dumps(value).encode())
                if len(out) < n and keys[0] not in seen and keys[1] not in seen:
                    seen.update(keys)
                    out.append(value)
            return out

        def strings():
            return unique(lambda: rng.choice(["tag", "a", ""]) + word(), rng.randint(1, 7))

        ENUM = [f"a{i}" for i in range(12)]
        MIXED = list(range(13)) + ["x", True]
        SCHEMAS = [
            ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, strings),
            ({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
              "required": ["tags"]}, lambda: {"tags": strings()}),
            ({"type": "array", "items": {"type": "number"}, "uniqueItems": True},
             lambda: unique(lambda: rng.choice([0, 1, -1, 1.5, 10, 1e3, 2.0, 0.5, 3, 7.25, -0.5]), rng.randint(1, 6))),
            ({"type": "array", "uniqueItems": True}, lambda: unique(any_value, rng.randint(1, 6))),
            ({"type": "array", "uniqueItems": True, "items": {"type": "object"}},
             lambda: unique(lambda: {rng.choice("abc"): any_value(1) for _ in range(rng.randint(0, 3))}, rng.randint(1, 5))),
            ({"type": "array", "uniqueItems": True, "items": {"type": "object", "properties": {
                "name": {"enum": ["a"]}, "value": {"type": "string"}}, "required": ["name", "value"]}},
             lambda: [{"name": "a", "value": v} for v in strings()]),
            ({"type": "array", "uniqueItems": True, "items": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
             lambda: unique(strings, rng.randint(1, 4))),
            ({"type": "array", "items": {"type": ["string", "null"]}, "uniqueItems": True}, lambda: strings() + [None]),
            ({"type": "array", "items": {"type": "string", "pattern": "^[^,]+$"}, "uniqueItems": True},
             lambda: list(dict.fromkeys(s.replace(",", "") or "z" for s in strings()))),
            ({"type": "array", "uniqueItems": True, "items": {"type": "string", "enum": ENUM}}, lambda: rng.sample(ENUM, rng.randint(1, 12))),
            ({"type": "array", "uniqueItems": True, "items": {"enum": MIXED}}, lambda: rng.sample(MIXED, rng.randint(1, 15))),
            ({"type": "array", "uniqueItems": True, "items": {"type": "array", "items": {"type": "boolean"}}},
             lambda: unique(lambda: [rng.random() < 0.5 for _ in range(rng.randint(0, 3))], rng.randint(1, 5))),
        ]
        rows = mismatches = native_rows = engine_refused = 0
        compiled = {}
        for case in range(120):
            number = case % len(SCHEMAS)
            schema, make = SCHEMAS[number]
            text = json.dumps(make(), ensure_ascii=rng.random() < 0.3, indent=rng.choice([None, None, 1]))
            if number not in compiled:
                compiled[number] = backend.compile(parse_guided_request({"guided_json": schema}))
            grammar = backend.new_grammar(compiled[number])
            width = (backend.vocab_size + 31) // 32
            for token in tokenizer.encode(text):
                bits = torch.zeros((2, width), dtype=torch.int32)
                grammar.inner.fill_bitmask(bits, 0)
                bits[1] = bits[0]
                native_rows += native.is_plan(grammar._plan())
                grammar.restrict(bits, 0)
                native.ENABLED = False
                grammar.restrict(bits, 1)
                native.ENABLED = True
                rows += 1
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
    assert result["native_rows"] >= result["rows"] * 0.8, result
    assert result["engine_refused"] <= 40, result  # xgrammar takes no escapes in patterned strings, some spellings


def test_native_matches_the_reference_with_every_token_allowed():
    """No engine: the tracker is pushed into crafted states and the row allows every token, so every
    token of the candidate classes is decided both ways (split characters, invalid UTF-8 items,
    escapes, brackets with and without a guarded array around, numbers, literals, object items,
    finite domains, languages that run out or not)."""
    result = run_isolated(NO_ENGINE + r'''
import json
import numpy as np
from fd_guided.schema.unique_paths import UniquePaths
from fd_guided.tokenizer import load_tokenizer
from fd_guided.unique import guard, native

tokenizer = load_tokenizer("deepseek")
width = (len(tokenizer.token_bytes) + 31) // 32
STRINGS = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
ANY = {"type": "array", "uniqueItems": True}
NAMED = {"type": "array", "uniqueItems": True, "items": {"type": "object", "additionalProperties": False, "required": ["id", "name"],
                                                         "properties": {"id": {"type": "number"}, "name": {"type": "string"}}}}
cases = [
    (STRINGS, ['["ab', 'c", "a', 'b"', ', "ab']),
    (STRINGS, ['["tag', '", "tag ', 'x", ', '"t']),
    (STRINGS, ['["\xc3\xa9', '", "\xc3']),            # a character split across tokens
    (STRINGS, ['["\xff', '", "']),                     # an item that is not UTF-8
    (STRINGS, ['["a\\n', '", "b', '", ']),
    (STRINGS, ['["x", "y"', ' ']),
    (STRINGS, ['["\\u0061', '", "a']),                 # an escape spelling a used string
    ({"type": "object", "properties": {"t": STRINGS}}, ['{"t": ["a', '", "b', '", "']),
    ({"type": "array", "uniqueItems": True, "items": STRINGS}, ['[["a', '", "b"], ["a', '", "b']),
    ({**STRINGS, "items": {"type": "string", "pattern": "^[a-z]+$"}}, ['["ab', '", "a']),
    ({**STRINGS, "items": {"type": "string", "maxLength": 2}}, ['["ab', '", "a']),  # runs out: Python
    ({**STRINGS, "items": {"type": ["string", "null"]}}, ['["a', '", null, "']),
    (ANY, ['[1', ', 1.5', ', -2', ', ']),                # numbers: ended by the next token
    (ANY, ['[true', ', null', ', 1e2', ', 10']),          # literals and a number spelled two ways
    (ANY, ['[{"a": 1', ', "b": [true]}', ', {"b": [true', '], "a": 1']),  # an object item repeated in another order
    (ANY, ['[{"a": "x"}', ', {"a": "', 'x']),
    (ANY, ['[[1, 2]', ', [1', ', 2']),
    (ANY, ['["a"', ', {"k": {"q": [', '1, {"z": null}', '], "r": "s"']),  # deep inside an item
    # a member's value in an object item: the values after which closing it would repeat one
    (NAMED, ['[{"id": 1, "name": "xy"}', ', {"id": 1, "name": "x', 'y']),
    (NAMED, ['[{"id": 1, "name": "xy"}, {"id": 1.0, "name":', ' ']),   # 1.0 keys as 1
    (NAMED, ['[{"id": 1, "name": "a\\"b"}', ', {"id": 1, "name": "a']),  # a used value with an escape
    ({"type": "array", "uniqueItems": True, "items": {"type": "object"}}, ['[{"a": "x"}', ', {"b": 2, "a": "', 'x']),
    ({"type": "array", "uniqueItems": True, "items": {"type": "string", "enum": [f"a{i}" for i in range(12)]}},
     ['["a1"', ', "a11"', ', "a1']),                     # a finite domain
    ({"type": "array", "uniqueItems": True, "items": {"enum": [1, 2, True, "x"]}}, ['[1', ', true', ', ']),
]
compared = native_rows = 0
for schema, chunks in cases:
    grammar = guard.UniqueItemsGrammar(NoEngine(), UniquePaths(schema), tokenizer.token_bytes, width * 32)
    for chunk in chunks:
        data = chunk.encode("latin-1") if "\xff" in chunk or "\xc3" in chunk else chunk.encode()
        native_rows += push_and_compare(grammar, (schema, chunk), data, width)
        compared += 1
print(json.dumps({"compared": compared, "states": sum(len(chunks) for _, chunks in cases), "native_rows": native_rows}))
''', timeout_s=900)
    assert result["compared"] == result["states"] and result["native_rows"] >= 50, result


def test_a_large_finite_domain_through_its_shared_cache():
    """A finite domain past enumeration (`_native.Domain`, domain.c): its cache of the spellings
    each token reaches from an item's bytes so far is shared by every guard of the domain. Guards
    in different states (inside items at many prefixes, between items, after items used, commas
    and brackets inside spellings, a number that can go on) decide rows with every token allowed
    both ways, bit for bit; past the cache's bound (10 prefixes of 129,280 tokens) it starts
    again and stays right. The Domain refuses spellings out of order."""
    result = run_isolated(NO_ENGINE + r'''
import json
import numpy as np
from fd_guided.schema.unique_paths import UniquePaths
from fd_guided.tokenizer import load_tokenizer
from fd_guided.unique import guard, native

tokenizer = load_tokenizer("deepseek")
width = (len(tokenizer.token_bytes) + 31) // 32
VALUES = [f"tag number {i} of the list" for i in range(200)] + ["x", "xy", "xyz", "a,b", "a]b", "", "x y", 7, 70, True, None]
SCHEMA = {"type": "array", "uniqueItems": True, "items": {"enum": VALUES}}
paths = UniquePaths(SCHEMA)
states = [
    ['["tag number 1', '2'],                       # inside an item, digits going on
    ['["tag number 12 of the list"', ', "tag number 1', '2'],  # the same prefix, one spelling used
    ['["tag number 12 of the list", "tag number 1', ' of the l'],
    ['["x"', ', "x'],                              # "x" used: "xy", "xyz" go on
    ['["x", "xy", "xyz"', ', '],                   # all three used: "x is a dead end
    ['["a,b"', ', "a'],                            # a comma and a bracket inside spellings
    ['["a,b", "a]b"', ', "'],
    ['[7', ', 7'],                                 # a number that can go on as 70
    ['["tag', ' number 3'],
    ['["tag number 19', '9 of the'],
    ['["tag number 199 of the list"', ', '],       # between items
    ['["x y"', ', ""', ', "x'],
    ['[', '"'],
]
compared = native_rows = 0
for chunks in states:
    grammar = guard.UniqueItemsGrammar(NoEngine(), paths, tokenizer.token_bytes, width * 32)
    for chunk in chunks:
        native_rows += push_and_compare(grammar, (chunks, chunk), chunk.encode(), width)
        compared += 1
domain = native.native_domain(grammar.tracker.stack[0][4].domain)  # the one every guard here shared
refused = []
for bad in [(b"b", b"a"), (b"a", b"a"), ("a",)]:
    try:
        native._native.Domain(bad)
    except (ValueError, TypeError) as error:
        refused.append(type(error).__name__)
print(json.dumps({"compared": compared, "states": sum(map(len, states)), "native_rows": native_rows,
                  "cached": list(domain.cached()), "refused": refused}))
''', timeout_s=900)
    assert result["compared"] == result["states"] and result["native_rows"] == result["states"], result
    # 10 item prefixes of every token each (1.29M pairs) passed the bound: the cache started again
    prefixes, entries = result["cached"]
    assert 0 < prefixes < 10 and 0 < entries <= (1 << 20) + 130_000, result
    assert result["refused"] == ["ValueError", "ValueError", "TypeError"], result


def test_canonical_keys_agree_with_item_keys():
    """`canon.c` says two values are equal exactly when `item_keys` does (jsonschema's equality, and
    exact decimals), on random pairs of JSON texts spelled many ways; where it cannot say, the
    guard asks Python, so None is allowed only for texts Python keys as raw or C refuses on purpose."""
    result = run_isolated(r'''
import json, random
from fd_guided.unique import native
from fd_guided.unique.items import item_keys

rng = random.Random(3)
NUMBERS = ["0", "-0", "1", "1.0", "1e0", "10e-1", "0.1e1", "100", "1e2", "1E+2", "0.5", "5e-1", "0.1",
           "0.10000000000000001", "1" + "0" * 30, "1e30", "1e400", "2e400", "-1e400", "123456789012345678901234567890",
           "1.5", "15e-1", "9007199254740993", "9007199254740992.0", "1e-400", "-0.0", "3", "3.000"]
STRINGS = ['"a"', '"\\u0061"', '"é"', '"\\u00e9"', '"\\ud83d\\ude00"', '"😀"', '"\\n"', '"\\/"', '"/"', '""',
           '"\\ud800"', '"a\\"b"', '"\\u0000"', '"tab\\t"']
LITERALS = ["true", "false", "null"]

def value(depth=0):
    pick = rng.random()
    if depth < 3 and pick < 0.2:
        return "[" + ", ".join(value(depth + 1) for _ in range(rng.randint(0, 3))) + "]"
    if depth < 3 and pick < 0.4:
        keys = [rng.choice(STRINGS[:6]) for _ in range(rng.randint(0, 3))]
        return "{" + ",".join(f"{k}: {value(depth + 1)}" for k in keys) + "}"
    return rng.choice(NUMBERS + STRINGS + LITERALS)

texts = [value().encode() for _ in range(3000)] + [t.encode() for t in NUMBERS + STRINGS + LITERALS]
pairs = agree = refused = 0
keyed = [(text, native.canon(text), item_keys(text)) for text in texts]
for text, c, k in keyed:
    if c is None:
        refused += 1
        assert k[0][0] == "raw" or k[1][0] == "raw" or b"\\ud800" in text or b"e400" in text or b"e-400" in text, text
for _ in range(40000):
    (ta, ca, ka), (tb, cb, kb) = rng.choice(keyed), rng.choice(keyed)
    if ca is None or cb is None:
        continue
    pairs += 1
    python_equal = ka[0] == kb[0] or ka[1] == kb[1]
    c_equal = ca[0] == cb[0] or ca[1] == cb[1]
    assert python_equal == c_equal, (ta, tb, ka, kb, ca, cb)
    agree += python_equal
print(json.dumps({"pairs": pairs, "equal_pairs": agree, "refused": refused, "texts": len(texts)}))
''', timeout_s=600)
    assert result["pairs"] >= 30000 and result["equal_pairs"] >= 500, result
    assert result["refused"] <= result["texts"] // 5, result


def test_hostile_inputs_neither_crash_nor_grow_without_bound():
    """10,000 items, nesting past the C side's frames and its key depth, a 200 KB string item: the
    rows still match the reference where compared, memory stays bounded, no crash."""
    result = run_isolated(NO_ENGINE + r'''
import json, resource, time
import numpy as np
from fd_guided.schema.unique_paths import UniquePaths
from fd_guided.tokenizer import load_tokenizer
from fd_guided.unique import guard, native

tokenizer = load_tokenizer("deepseek")
width = (len(tokenizer.token_bytes) + 31) // 32
rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

def compare(grammar):
    grammar.tracker.fill_plan = grammar._make_plan()
    bits = np.full((2, width), -1, dtype=np.int32)
    guard.restrict_rows([grammar], bits, [0])
    native.ENABLED = False
    guard.restrict_rows([grammar], bits, [1])
    native.ENABLED = True
    assert np.array_equal(bits[0], bits[1]), bytes(grammar.tracker.buffer)[-80:]

def guarded(schema):
    return guard.UniqueItemsGrammar(NoEngine(), UniquePaths(schema), tokenizer.token_bytes, width * 32)

started, before = time.time(), rss()
out = {}
# 10,000 string items, a plan made at every token as accept_token does; compared at a few points
strings = guarded({"type": "array", "items": {"type": "string"}, "uniqueItems": True})
assert strings.tracker.push(b"[")
for i in range(10_000):
    for chunk in (b'"item %d' % i, b'", ' if i < 9_999 else b'"'):
        assert strings.tracker.push(chunk)
        strings.tracker.fill_plan = strings._make_plan()
    if i in (0, 5_000, 9_998):
        compare(strings)
assert not strings.tracker.push(b', "item 77"')  # a repeat among 10,000 is still refused
out["items_s"] = round(time.time() - started, 1)
# nesting deeper than the C side's frames and its canonical keys' depth
deep = guarded({"type": "array", "uniqueItems": True})
for chunk in [b"[", b"[1]", b", "] + [b"["] * 150 + [b"1"] + [b"]"] * 149:
    assert deep.tracker.push(chunk)
compare(deep)
assert deep.tracker.push(b"]") and deep.tracker.push(b", ")
for chunk in [b"["] * 150 + [b"1"] + [b"]"] * 149:
    assert deep.tracker.push(chunk)
compare(deep)
# a 200 KB string item, then the same string begun again
long = guarded({"type": "array", "items": {"type": "string"}, "uniqueItems": True})
assert long.tracker.push(b'["') and long.tracker.push(b"x" * 200_000) and long.tracker.push(b'", "')
for _ in range(50):
    assert long.tracker.push(b"x" * 4_000)
compare(long)
out["grew_mb"] = round(rss() - before, 1)
out["seconds"] = round(time.time() - started, 1)
print(json.dumps(out))
''', timeout_s=900)
    assert result["grew_mb"] < 400, result



def test_plain_pushes_in_c_leave_the_python_state():
    """`native.push_plain` (push.c): a token of plain bytes inside a string, pushed and planned in C
    by `accept_token`, leaves the tracker as the Python path does (bytes, snapshot history, flags)
    with a plan that restricts an all-allowed row as the reference does; a finite item's dead end
    is refused both ways with the state kept. Random documents (string items, a finite domain with
    shared prefixes, member values of object items, escapes, multi-byte characters), random plain
    tokens tried inside strings and rolled back, as speculative decoding does; after a rollback
    inside a string the next token is shorter, or holds an escape (the plan is made afresh: the
    reused one raised ValueError, or missed the escape). Each step's plan restricts a row of 1,500
    random tokens as the reference does."""
    result = run_isolated(NO_ENGINE + r'''
import json, random
import numpy as np
from fd_guided.schema.unique_paths import UniquePaths
from fd_guided.tokenizer import load_tokenizer
from fd_guided.unique import guard, native

rng = random.Random(11)
tokenizer = load_tokenizer("deepseek")
width = (len(tokenizer.token_bytes) + 31) // 32
ENUM = ["tag number %d of the list" % i for i in range(30)] + ["x", "xy", "xyz", "a,b", ""]
WORDS = ["a", "b", "é", "\\n", "日本", "x y", " of the list"]
SCHEMAS = [
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True},
     lambda: list(dict.fromkeys("tag " + rng.choice(WORDS) * rng.randint(0, 3) for _ in range(rng.randint(1, 6))))),
    ({"type": "array", "uniqueItems": True, "items": {"enum": ENUM}}, lambda: rng.sample(ENUM, rng.randint(1, 12))),
    ({"type": "array", "uniqueItems": True, "items": {"type": "object", "additionalProperties": False,
      "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}, "required": ["id", "name"]}},
     lambda: [{"id": i, "name": rng.choice(["tag one", "tag two", "tag"])} for i in range(rng.randint(1, 5))]),
]
plain = [t for t, b in enumerate(tokenizer.token_bytes) if b and b'"' not in b and b"\\" not in b]
taken = {"c": 0}
push_plain = native.push_plain
def counted(tracker, data):
    pushed = push_plain(tracker, data)
    taken["c"] += pushed is not None
    return pushed
native.push_plain = counted

def state(grammar):
    t = grammar.tracker
    return (bytes(t.buffer), t.mode, t.escape, t.is_key, t.start, t.closing, t.duplicate,
            [(h[0], h[2], h[3], h[4], h[5]) for h in t._history], native.is_plan(t.fill_plan))

def accept_both(c_side, python, token):
    native.ENABLED = True
    ok = c_side.accept_token(token)
    native.ENABLED = False
    assert python.accept_token(token) == ok, token
    native.ENABLED = True
    assert state(c_side) == state(python), (token, state(c_side)[0][-40:])
    return ok

steps = refused = rows = 0
for case in range(90):
    schema, make = SCHEMAS[case % len(SCHEMAS)]
    paths = UniquePaths(schema)
    ids = tokenizer.encode(json.dumps(make(), ensure_ascii=rng.random() < 0.3))
    c_side, python = (guard.UniqueItemsGrammar(NoEngine(), paths, tokenizer.token_bytes, width * 32) for _ in "cp")
    for token in ids:
        if c_side.tracker.mode == 1:  # inside a string: plain tokens tried and rolled back
            for tried in [rng.choice(plain) for _ in range(3)]:
                steps += 1
                if accept_both(c_side, python, tried):
                    c_side.rollback(1), python.rollback(1)
                else:
                    refused += 1
        steps += 1
        assert accept_both(c_side, python, token), (case, tokenizer.decode(ids))
        bits = np.zeros((2, width), dtype=np.int32)  # 1,500 random tokens allowed (the reference tries each)
        allowed = np.array(rng.sample(range(len(tokenizer.token_bytes)), 1500))
        np.bitwise_or.at(bits[0].view(np.uint32), allowed >> 5, (1 << (allowed & 31)).astype(np.uint32))
        bits[1] = bits[0]
        guard.restrict_rows([c_side], bits, [0])
        native.ENABLED = False
        guard.restrict_rows([python], bits, [1])
        native.ENABLED = True
        assert np.array_equal(bits[0], bits[1]), (case, bytes(c_side.tracker.buffer)[-40:])
        rows += 1
native.push_plain = push_plain
print(json.dumps({"steps": steps, "taken": taken["c"], "refused": refused, "rows": rows}))
''', timeout_s=900)
    assert result["taken"] >= result["steps"] // 5 and result["refused"] >= 50 and result["rows"] >= 1000, result


def test_rows_of_a_batch_share_a_finite_domain_state():
    """A batch's rows that begin and finish the same items of a finite domain share one unused
    tuple per used set (`items._unused_after`, `items.sorted_texts`) and with it one counts
    object on the `Domain` (domain.c keeps the last few by the tuple's identity); rows in other
    orders (more used sets than the Domain keeps) and a walk with the identity caches cleared
    midway decide every row as the reference does, bit for bit, from the same allowed tokens;
    so do rows that allow many plain tokens, where a row decided by the domain's shortcut alone
    is kept for the next rows of the call in its state (`RowMemo`, domain.c), and rows that
    differ from it by one token."""
    result = run_isolated(NO_ENGINE + r'''
import json, random
import numpy as np
from fd_guided.schema.unique_paths import UniquePaths
from fd_guided.tokenizer import load_tokenizer
from fd_guided.unique import guard, items, native

rng = random.Random(5)
tokenizer = load_tokenizer("deepseek")
width = (len(tokenizer.token_bytes) + 31) // 32
VALUES = [f"tag number {i} of the list" for i in range(60)] + ["x", "xy", "a,b", ""]
paths = UniquePaths({"type": "array", "uniqueItems": True, "items": {"enum": VALUES}})
lockstep = rng.sample(VALUES, 8)
orders = [lockstep] * 4 + [rng.sample(VALUES, 8) for _ in range(6)]
rows = [guard.UniqueItemsGrammar(NoEngine(), paths, tokenizer.token_bytes, width * 32) for _ in orders]
texts = [json.dumps(order) for order in orders]
chunked = [[tokenizer.token_bytes[t] for t in tokenizer.encode(text)] for text in texts]
plain = [t for t, b in enumerate(tokenizer.token_bytes) if b and b'"' not in b and b"\\" not in b]
steps = max(map(len, chunked))
compared = shared = 0
for step in range(steps):
    if step == steps // 2:
        items._UNUSED_AFTER.clear(), items._KEYS_BY_ID.clear(), native._DOMAINS.clear()
    live = [i for i, chunks in enumerate(chunked) if step < len(chunks)]
    for i in live:
        assert rows[i].tracker.push(chunked[i][step]), (i, step)
        rows[i].tracker.fill_plan = rows[i]._make_plan()
    # any tokens (quotes and backslashes among them: the machine), then plain ones only, where a
    # row's decision is kept for the next rows in its state (domain.c's RowMemo): row 1 allows one
    # token more, row 2 one fewer, row 3 is row 0 again
    for pool in (range(len(tokenizer.token_bytes)), plain):
        bits = np.zeros((2 * len(rows), width), dtype=np.int32)
        allowed = np.array(rng.sample(pool, 3000))
        np.bitwise_or.at(bits[0].view(np.uint32), allowed >> 5, (1 << (allowed & 31)).astype(np.uint32))
        bits[:] = bits[0]
        extra, missing = rng.choice(plain), int(allowed[0])
        bits[[1, len(rows) + 1], extra >> 5] |= np.int32(np.uint32(1 << (extra & 31)).view(np.int32))
        bits[[2, len(rows) + 2], missing >> 5] &= np.int32(np.uint32(~(1 << (missing & 31)) & 0xFFFFFFFF).view(np.int32))
        native.ENABLED = True
        guard.restrict_rows([rows[i] for i in live], bits, live)
        native.ENABLED = False
        guard.restrict_rows([rows[i] for i in live], bits, [len(rows) + i for i in live])
        native.ENABLED = True
        for i in live:
            assert np.array_equal(bits[i], bits[len(rows) + i]), (i, step, bytes(rows[i].tracker.buffer)[-30:])
            compared += 1
    tops = [rows[i].tracker.stack[-1][4] for i in live if i < 4 and rows[i].tracker.stack]
    if len(tops) == 4 and tops[0] is not None and tops[0].unused is not None:
        shared += all(top.unused is tops[0].unused and top.domain is tops[0].domain for top in tops)
print(json.dumps({"compared": compared, "shared": shared, "steps": len(chunked[0]),
                  "native": sum(native.is_plan(r.tracker.fill_plan) for r in rows)}))
''', timeout_s=900)
    # every lockstep step inside the array (all but its closing token) shared its unused tuple,
    # the caches cleared midway too
    assert result["compared"] >= 2 * 8 * 60 and result["shared"] == result["steps"] - 1, result
