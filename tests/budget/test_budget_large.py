"""Budget steering on large schemas: start plans written from the schema, re-plans that land back on
the plan (issue #24). Orders shaped like tools/load.py's `complex_schema` (nested required objects
through $defs, anyOf with null, patterns, a date format, enums, an array of required objects),
whose shortest document (~80 bytes) the best-first search alone does not find in its 3,000 fills.
The adversarial decoder of tests/budget decodes each at 1.2x, 2x and 3x its shortest output on
DeepSeek's vocabulary, every backend: each ends ``stop`` and validates (jsonschema, format checking)."""

from __future__ import annotations

import functools
import json
import math

import jsonschema
import pytest
import torch
from adversary import pick, pick_opener

from fd_guided import GuidedConfig, GuidedDecodingManager, parse_guided_request
from fd_guided.budget import shortest_completion, token_table
from fd_guided.registry import create_backend
from fd_guided.tokenizer import load_tokenizer

pytestmark = pytest.mark.cpu

VOCAB = 129_280
# xgrammar compiles each order in seconds; on a loaded machine past the default 10 s budget
COMPILE_TIMEOUT_S = 120


def order_schema(index: int) -> dict:
    tag = f"o{index}"
    address = {
        "type": "object",
        "properties": {
            f"street_{tag}": {"type": "string", "maxLength": 24},
            "zip": {"type": "string", "pattern": f"^[0-9]{{5}}(-{index % 10}[0-9]{{3}})?$"},
            "country": {"enum": ["FR", "DE", f"X{index}"]},
        },
        "required": [f"street_{tag}", "zip", "country"],
    }
    item = {
        "type": "object",
        "properties": {
            "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
            "qty": {"type": "integer", "minimum": 1, "maximum": 50 + index},
            "tags": {"type": "array", "items": {"enum": ["new", "sale"]}, "maxItems": 3},
        },
        "required": ["sku", "qty"],
    }
    return {
        "type": "object",
        "$defs": {"address": address, "item": item},
        "properties": {
            f"id_{tag}": {"type": "integer", "minimum": 0},
            "created": {"type": "string", "format": "date"},
            "status": {"enum": ["open", "paid", f"s{index}"]},
            "shipping": {"$ref": "#/$defs/address"},
            "billing": {"anyOf": [{"$ref": "#/$defs/address"}, {"type": "null"}]},
            "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 4},
        },
        "required": [f"id_{tag}", "created", "status", "shipping", "items"],
        "additionalProperties": False,
    }


ORDERS = [order_schema(index) for index in range(2)]


@functools.lru_cache(maxsize=4)
def backend_of(name: str):
    return create_backend(
        name,
        load_tokenizer("deepseek"),
        vocab_size=VOCAB,
        config=GuidedConfig(backend=name, compile_timeout_s=COMPILE_TIMEOUT_S),
    )


def valid(schema: dict, text: str) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    return jsonschema.Draft202012Validator(schema, format_checker=checker).is_valid(value)


def decode(
    backend_name: str, schemas: list[dict], budgets: list[int], chooser=pick
) -> tuple[list, GuidedDecodingManager]:
    """The adversary (`chooser`) decodes each schema at its budget; (finish, text, tokens) each, and the manager."""
    tokenizer = load_tokenizer("deepseek")
    manager = GuidedDecodingManager(backend_of(backend_name), max_num_seqs=len(schemas))
    config = GuidedConfig(backend=backend_name, compile_timeout_s=COMPILE_TIMEOUT_S)
    try:
        for slot, (schema, budget) in enumerate(zip(schemas, budgets)):
            spec = parse_guided_request({"guided_json": schema}, config)
            manager.add_request(slot, spec, prefill_done=True, max_tokens=budget)
        assert manager.wait_ready(list(range(len(schemas))), timeout_s=4 * COMPILE_TIMEOUT_S)
        outputs: dict[int, list[int]] = {slot: [] for slot in range(len(schemas))}
        finish: dict[int, str] = {}
        logits = torch.zeros((len(schemas), VOCAB))
        while len(finish) < len(schemas):
            rows = [slot if slot not in finish else None for slot in range(len(schemas))]
            manager.begin_step(rows)
            manager.apply(logits)
            words = manager.bitmask.numpy()
            tokens = [chooser(tokenizer, words[row], VOCAB) if rows[row] is not None else 0 for row in range(len(rows))]
            done = {f.slot: f for f in manager.accept(tokens)}
            for slot, token in enumerate(tokens):
                if rows[slot] is None:
                    continue
                if slot in done:
                    finish[slot] = "stop" if done[slot].reason != "error" else f"error: {done[slot].error}"
                    continue
                outputs[slot].append(token)
                if len(outputs[slot]) >= budgets[slot]:
                    finish[slot] = "length"
        return [(finish[s], tokenizer.decode(outputs[s]), len(outputs[s])) for s in range(len(schemas))], manager
    finally:
        manager.close()


def start_need(backend_name: str, schema: dict) -> int:
    """The shortest output's tokens (stop included) as the manager's start plan has it."""
    manager = GuidedDecodingManager(backend_of(backend_name), max_num_seqs=1)
    manager.budget.defer_start_above = 10**9  # the first look plans at once
    try:
        spec = parse_guided_request({"guided_json": schema}, GuidedConfig(backend=backend_name))
        manager.add_request(0, spec, prefill_done=True, max_tokens=10_000)
        assert manager.wait_ready([0], timeout_s=2 * COMPILE_TIMEOUT_S)
        manager.begin_step([0])
        manager.apply(torch.zeros((1, VOCAB)))
        need = manager.budget.need(0)
        manager.accept([0])
        assert need is not None, "no start plan"
        return need
    finally:
        manager.close()


@pytest.mark.parametrize("backend_name", ["xgrammar", "llguidance", "auto"])
def test_the_adversary_ends_large_schemas_valid_within_budget(backend_name):
    needs = [start_need(backend_name, schema) for schema in ORDERS]
    cases = [(schema, budget) for schema, need in zip(ORDERS, needs) for budget in (math.ceil(1.2 * need), 2 * need)]
    cases += [(ORDERS[0], 3 * needs[0])]
    results, manager = decode(backend_name, [s for s, _ in cases], [b for _, b in cases])
    for (schema, budget), (finish, text, used) in zip(cases, results):
        assert finish == "stop", (budget, finish, text)
        assert used < budget, (budget, used)  # the stop token fits too
        assert valid(schema, text), (budget, text)
    assert manager.metrics.value("budget_search_failures_total") == 0


OPTIONAL_SHIPPING = {**ORDERS[1], "required": [name for name in ORDERS[1]["required"] if name != "shipping"]}
# A required contact, null or an address: no optional member, so no landmark holds the address
# (the plan writes null); only the schema's own choice bounds what the object branch adds.
NULL_OR_ADDRESS = {
    "type": "object",
    "$defs": ORDERS[0]["$defs"],
    "properties": {"contact": ORDERS[0]["properties"]["billing"], "note": {"type": "string"}},
    "required": ["contact", "note"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("chooser", [pick, pick_opener], ids=["adversary", "opener"])
@pytest.mark.parametrize("backend_name", ["xgrammar", "llguidance"])
def test_no_optional_member_is_opened_without_room_to_close_it(backend_name, chooser):
    """The adversary (and the opener, which takes ``{``, ``[`` or ``,`` first wherever a row allows
    one) at every budget from the shortest output to 44 tokens past it, for an order, one whose
    shipping address is optional, and one whose required contact is null or an address: each
    output ends ``stop`` and validates, and nothing overran. On main budgets 40-43 past an order's
    shortest ended ``length`` (a second ``items`` entry, 12 tokens, opened with 9-12 tokens of
    slack past the fixed headroom of 8), 17-26 past the optional shipping's, and 11-14 past the
    contact's for the opener (the address branch where the plan writes null, which no landmark
    holds: `growth.start_growth` bounds it from the schema)."""
    cases = []
    for schema in (ORDERS[0], OPTIONAL_SHIPPING, NULL_OR_ADDRESS):
        need = start_need(backend_name, schema)
        cases += [(schema, budget) for budget in range(need, need + 45)]
    results, manager = decode(backend_name, [s for s, _ in cases], [b for _, b in cases], chooser)
    cut = [
        (budget, finish, text)
        for (schema, budget), (finish, text, _) in zip(cases, results)
        if finish != "stop" or not valid(schema, text)
    ]
    assert not cut, cut[:3]
    assert manager.metrics.value("budget_overruns_total") == 0


class Counted:
    """A matcher that counts its fills (the search's cost)."""

    def __init__(self, grammar):
        self.grammar, self.fills = grammar, 0

    def __getattr__(self, name):
        return getattr(self.grammar, name)

    def fill_bitmask(self, bitmask, row):
        self.fills += 1
        self.grammar.fill_bitmask(bitmask, row)


def off_the_plan(engine: str, schema: dict, written_after: bytes, cut_before: bytes):
    """A matcher at `written` (the start plan up to `cut_before`, then `written_after`), the plan's
    rest from there, the start plan's landmarks, and what the search needs."""
    backend = backend_of(engine)
    spec = parse_guided_request({"guided_json": schema}, GuidedConfig(backend=engine))
    grammar = backend.new_grammar(backend.compile_checked(spec))
    manager = GuidedDecodingManager(backend, max_num_seqs=1)
    try:
        [start, *_] = manager.budget.start_hints(spec, engine)
        landmarks = manager.budget.start_landmarks(spec, engine)
    finally:
        manager.close()
    table = token_table(backend.tokenizer)
    cut = start.index(cut_before)
    written = start[:cut] + written_after
    prefix = table.tokenize(written)
    assert grammar.accept_tokens(prefix) == len(prefix)
    scratch = backend.allocate_bitmask(1)
    search = (table, backend.stop_token_ids, scratch.numpy()[0], scratch, 0)
    return grammar, written, start, start[cut:], landmarks, search


@pytest.mark.parametrize("engine", ["xgrammar", "llguidance"])
def test_a_search_off_the_plan_lands_back_on_it(engine):
    """From a state the plan does not pass through (an optional address opened after the plan
    wrote the required one), the search with the plan's rest and its start plan to land on finds
    a completion in a few dozen fills (the rest of the required address, then the plan's rest);
    without them, the best-first search runs out."""
    schema = ORDERS[0]
    grammar, written, start, rest, _, search = off_the_plan(
        engine,
        schema,
        b',"billing":{"street_o0":"x',
        b',"items":',  # billing is optional: the plan skips it
    )
    assert b"billing" not in start
    counted = Counted(grammar)
    found = shortest_completion(counted, *search, hints=[rest], landmarks=[start])
    assert found is not None and counted.fills < 100, counted.fills
    assert found.text.endswith(rest)  # it landed on the plan
    assert valid(schema, (written + found.text).decode())
    # a real completion in its own tokens, and the matcher is where it was
    assert grammar.validate_tokens(found.tokens) == len(found.tokens)
    assert shortest_completion(grammar, *search, max_expansions=400) is None
    assert grammar.validate_tokens(found.tokens) == len(found.tokens)


@pytest.mark.parametrize("engine", ["xgrammar", "llguidance"])
def test_an_optional_object_no_plan_holds_lands_on_its_variant(engine):
    """An optional address where no address was written: the start plan's landmarks (the shortest
    output with one optional property more each) hold one, and the search lands on its rest; with
    the plan's text alone it searches the whole address (hundreds of fills)."""
    schema = OPTIONAL_SHIPPING
    grammar, written, start, rest, landmarks, search = off_the_plan(
        engine, schema, b',"shipping":{"street_o1":"x', b',"items":'
    )
    assert b"shipping" not in start and any(b'"shipping":{' in mark for mark in landmarks)
    counted = Counted(grammar)
    found = shortest_completion(counted, *search, hints=[rest], landmarks=[start, *landmarks])
    assert found is not None and counted.fills < 100, counted.fills
    assert valid(schema, (written + found.text).decode())
    alone = Counted(grammar)
    assert shortest_completion(alone, *search, hints=[rest], landmarks=[start]) is not None
    assert alone.fills > 2 * counted.fills, (alone.fills, counted.fills)
