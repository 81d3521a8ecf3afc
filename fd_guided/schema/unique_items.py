"""``uniqueItems`` at a value position, once the array leaf is final (`rules.finish_leaf`).

  - at most one item: dropped (every such array is unique);
  - items from a finite domain (enums, booleans, null): the distinct arrays are enumerated as an
    enum (at most `MAX_UNIQUE_ARRAYS`): exact;
  - items from an *open* domain (`open_domain`) in a request where the runtime guard runs
    (``ctx.unique_guard``: a ``json_schema`` request, the JSON is the whole output): dropped here
    and enforced by `fd_guided.unique_guard` while the output is generated: exact;
  - otherwise refused, named.
"""
from __future__ import annotations

from .formats import format_pattern
from .leaves import ANY, U, Leaf, item_at, json_key
from .refusal import Refusal
from .regex import extendable

MAX_UNIQUE_ARRAYS = 256


def finish_unique(leaf: Leaf, ctx) -> list[Leaf]:
    kw = leaf.kw
    if not kw["unique"]:
        return [leaf]
    plain = Leaf("array", {**kw, "unique": False}, leaf.origin, leaf.weak)
    if kw["max"] is not None and kw["max"] <= 1:
        return [plain]
    location = f"{leaf.origin}.uniqueItems"
    if getattr(ctx, "unique_guard", False) and _open_array(kw, ctx):
        return [plain]
    rest = _domain(ANY if kw["items"] is None else kw["items"])
    if rest is None:
        limit = kw["max"] if kw["max"] is not None else len(kw["prefix"]) if kw["items"] is not None and kw["items"].is_none else None
        if limit is None:
            raise Refusal("uniqueItems over items that are not from a small finite set", location)
    else:
        limit = len(kw["prefix"]) + len(rest)
        if kw["max"] is not None:
            limit = min(limit, kw["max"])
    domains = []
    for index in range(limit):
        domain = _domain(item_at(kw, index))
        if domain is None:
            raise Refusal("uniqueItems over items that are not from a small finite set", location)
        domains.append(domain)
    arrays: list[list] = []
    _enumerate(domains, kw["min"], [], set(), arrays, location)
    return [Leaf("enum", {"values": tuple(arrays)}, leaf.origin, leaf.weak)] if arrays else []


def _open_array(kw: dict, ctx) -> bool:
    """Every position of the array holds an open domain (`open_domain`): nothing but items, or
    items and prefix items, all open."""
    positions = list(kw["prefix"]) + ([] if kw["items"] is None or kw["items"].is_none else [kw["items"]])
    if kw["items"] is None and not kw["prefix"]:
        return False  # any value: ``true`` cannot be continued into something else
    return bool(positions) and all(open_domain(u, ctx) for u in positions)


def open_domain(u: U, ctx, depth: int = 0) -> bool:
    """True when, from any prefix of any value of `u`, infinitely many values of `u` remain: a
    string with no maximum length and at most one `pattern` or `format` whose language never
    ends in a dead end (`regex.extendable`: e.g. ``^[a-z]+$``, ``uri``; not ``^(a|b+)$``,
    ``date``), or a number with no bounds or steps (an integer is not: ``0`` cannot be
    continued). Then however many items an array already holds, an item being written can always
    become a new one, so the uniqueness guard never leaves a request without a token
    (`fd_guided.unique_guard`)."""
    if u.is_any or u.is_none or depth > 8:
        return False
    for leaf in u.leaves:
        if leaf.kind == "ref":
            try:
                if not open_domain(ctx.expand(leaf), ctx, depth + 1):
                    return False
            except Refusal:
                return False
        elif leaf.kind == "string":
            if not _open_string(leaf.kw):
                return False
        elif leaf.kind == "number":
            if leaf.kw["lo"] is not None or leaf.kw["hi"] is not None or leaf.kw["steps"]:
                return False
        else:
            return False
    return True


def _open_string(kw: dict) -> bool:
    if kw["max"] is not None or len(kw["patterns"]) + len(kw["formats"]) > 1:
        return False  # two languages intersected: each extendable does not make both so
    if kw["patterns"]:
        return extendable(kw["patterns"][0])
    if kw["formats"]:
        pattern = format_pattern(kw["formats"][0])
        return pattern is not None and extendable(pattern, full_match=True)
    return True


def _domain(u: U) -> list | None:
    if u.is_any:
        return None
    values = []
    for leaf in u.leaves:
        if leaf.kind == "enum":
            values.extend(leaf.kw["values"])
        elif leaf.kind == "null":
            values.append(None)
        elif leaf.kind == "boolean":
            values.extend([True, False])
        else:
            return None
    return values


def _enumerate(domains, minimum, current, seen, out, location) -> None:
    if len(current) >= minimum:
        out.append(list(current))
        if len(out) > MAX_UNIQUE_ARRAYS:
            raise Refusal(f"uniqueItems with more than {MAX_UNIQUE_ARRAYS} possible arrays", location)
    if len(current) == len(domains):
        return
    for value in domains[len(current)]:
        key = json_key(value)
        if key in seen:
            continue
        seen.add(key)
        current.append(value)
        _enumerate(domains, minimum, current, seen, out, location)
        current.pop()
        seen.discard(key)
