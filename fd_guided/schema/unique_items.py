"""``uniqueItems`` at a value position, once the array leaf is final (`rules.finish_leaf`).

- at most one item: dropped (every such array is unique);
- items from a finite domain (enums, booleans, null): the distinct arrays are enumerated as an
  enum (at most `MAX_UNIQUE_ARRAYS`): exact; past that, with the runtime guard and plain
  literals (`_guardable_finite`), dropped here and enforced by the guard, which also refuses
  any token that leaves the item no unused value to become: exact and live;
- items from an *open* domain (`open_domain`) in a request where the runtime guard runs
  (``ctx.unique_guard``: a ``json_schema`` request, the JSON is the whole output): dropped here
  and enforced by `fd_guided.unique_guard` while the output is generated: exact;
- otherwise refused, named.
"""

from __future__ import annotations

from .deadline import checkpoint
from .formats import FORMAT_PATTERNS, format_pattern
from .intersection import array_max
from .leaves import ANY, Leaf, U, item_at, json_key
from .refusal import Refusal
from .regex import extendable, string_language
from .unique_paths import literal_text

MAX_UNIQUE_ARRAYS = 256
MAX_VISITS = 20_000  # partial arrays the enumeration may build before it refuses


class _Pending(Exception):
    """The items reach a definition whose normalisation is still under way (the array sits inside
    it: ``node: {children: {items: {$ref: node}}}``): decided again at emission (`emit`)."""


def finish_unique(leaf: Leaf, ctx) -> list[Leaf]:
    """The array leaf with ``uniqueItems`` rewritten (module docstring); the leaf unchanged (its
    ``unique`` kept) when its items reach a definition still being normalised: the emitter asks
    again once every definition is done."""
    try:
        return _finish_unique(leaf, ctx)
    except _Pending:
        return [leaf]


def _finish_unique(leaf: Leaf, ctx) -> list[Leaf]:
    kw = leaf.kw
    if not kw["unique"]:
        return [leaf]
    plain = Leaf("array", {**kw, "unique": False}, leaf.origin, leaf.weak)
    high = array_max(kw)
    if high is not None and high <= 1:
        return [plain]
    location = f"{leaf.origin}.uniqueItems"
    if ctx.unique_guard and (_open_array(kw, ctx) or _closing_guarded_objects(kw, ctx) or _counted_strings(kw, ctx)):
        return [plain]
    if ctx.unique_guard and ctx.ordered_objects and (moved := _open_property_last(kw, ctx)) is not None:
        return [Leaf("array", {**moved, "unique": False}, leaf.origin, leaf.weak)]
    rest = _domain(ANY if kw["items"] is None else kw["items"], ctx)
    if rest is None:
        limit = high
        if limit is None:
            raise Refusal("uniqueItems over items that are not from a small finite set", location)
    else:
        limit = len(kw["prefix"]) + len(rest)
        if high is not None:
            limit = min(limit, high)
    domains = []
    for index in range(limit):
        domain = _domain(item_at(kw, index), ctx)
        if domain is None:
            raise Refusal("uniqueItems over items that are not from a small finite set", location)
        domains.append(domain)
    arrays: list[list] = []
    try:
        _enumerate(domains, kw["min"], [], set(), arrays, location)
    except Refusal:
        if ctx.unique_guard and _guardable_finite(kw, rest):
            return [plain]
        raise
    return [Leaf("enum", {"values": tuple(arrays)}, leaf.origin, leaf.weak)] if arrays else []


def _guardable_finite(kw: dict, values: list | None) -> bool:
    """Too many unique arrays to enumerate, but one finite domain of plain literals for every
    item (no prefix items) with room for `minItems` distinct ones: the guard enforces it, keeping
    the request live by refusing any token after which every way on repeats an item
    (`json_tracker._Unique.live`), which needs each value's one spelling (`literal_text`).

    The guard reads the domain from the schema as written (`UniquePaths.item_domain`: enum/const
    or boolean/null through $ref/allOf/anyOf/oneOf). Where it cannot (an enum narrowed by another
    keyword such as maxLength or pattern) it guards as for open items: still no duplicate, but an
    adversarial choice of tokens could then end the request with "allows no token" instead of a
    value. On SchemaStore every array this admits is of the readable kind (checked 2026-11-24)."""
    if values is None or kw["prefix"] or any(literal_text(value) is None for value in values):
        return False
    return kw["min"] <= len({json_key(value) for value in values})


def _open_array(kw: dict, ctx) -> bool:
    """Every position of the array after the first (`_positions`) holds an open domain
    (`open_domain`): the first item has no earlier one to repeat."""
    positions = _positions(kw)
    later = positions[1:] if kw["prefix"] else positions
    return bool(positions) and all(open_domain(u, ctx) for u in later)


def _positions(kw: dict) -> list[U]:
    """The schemas of an array's positions: its prefix items, then its items unless they admit
    nothing (absent items are any value)."""
    return list(kw["prefix"]) + ([] if kw["items"] is not None and kw["items"].is_none else [kw["items"] or ANY])


def _closing_guarded_objects(kw: dict, ctx) -> bool:
    """Every position holds closed objects whose *last* property (in the order the engines write
    properties: the schema's) takes only open values (`_open_leaf`), e.g. ``{"name": ...,
    "value": {"type": "string"}}`` without extra properties, possibly beside open or literal
    alternatives (`_closing_guarded_position`). The guard refuses the ``}`` of a
    repeated item, and a token that ends a member value after which the engine allows nothing
    but that ``}`` (it asks the engine: `unique_guard.UniqueItemsGrammar._comma_allowed`). Live:
    until the last property is written it can still come (no ``maxProperties``), with a value no
    earlier item has; once written, only its own open value could end the item, and a token
    ending it as a repeat is refused while the value can still go on. Needs the engine to keep
    the schema's order (not ``guided_any_order``)."""
    if not ctx.ordered_objects:
        return False
    positions = _positions(kw)
    return bool(positions) and all(_closing_guarded_position(u, ctx) for u in positions)


def _closing_guarded_position(u: U, ctx) -> bool:
    """Every alternative is such an object, an open one (`_open_leaf`) or a literal (one of
    several object alternatives: the engine allows a comma while any alternative the prefix
    still fits has a property left, and then its last, open property is among them)."""
    leaves = _concrete_leaves(u, ctx, 0)
    if not leaves:
        return False
    opened = [leaf for leaf in leaves if _open_leaf(leaf, ctx)]
    closing = [leaf for leaf in leaves if leaf not in opened and _closing_object_leaf(leaf, ctx)]
    return bool(closing) and all(
        leaf in opened or leaf in closing or _literal_leaf(leaf) or _subsumed_enum(leaf, opened, ctx) for leaf in leaves
    )


def _counted_strings(kw: dict, ctx) -> bool:
    """Items are strings whose language can run out (a ``maxLength``, a pattern that ends: ``^\\d+x$``),
    maybe beside literals, with room for ``minItems`` of them. The guard reads the same language
    (`UniquePaths.item_strings`) and refuses any token after which the strings the item can still
    become are all used (`json_tracker._Unique.live`), and a comma once no string is left. Where
    the guard cannot read it from the schema as written (a string schema composed with allOf, say)
    it guards as for open strings: never a duplicate, but an adversarial token choice could end
    the request with "allows no token" (as for finite domains, `_guardable_finite`)."""
    if kw["prefix"] or kw["items"] is None:
        return False
    leaves = _concrete_leaves(kw["items"], ctx, 0)
    if not leaves or any(leaf is ANY for leaf in leaves):
        return False
    strings = [leaf for leaf in leaves if leaf.kind == "string"]
    literal = [leaf for leaf in leaves if leaf.kind != "string" and _literal_leaf(leaf)]
    if len(strings) != 1 or not all(leaf in strings or leaf in literal for leaf in leaves):
        return False
    string = strings[0].kw
    language = string_language(
        tuple(string["patterns"]), tuple(FORMAT_PATTERNS[f] for f in string["formats"]), string["min"], string["max"]
    )
    literals = sum(
        1 if leaf.kind == "null" else 2 if leaf.kind == "boolean" else len(leaf.kw["values"]) for leaf in literal
    )
    needed = max(kw["min"] - literals, 1)
    return language is not None and language.completions(0, needed) >= needed


def _open_property_last(kw: dict, ctx) -> dict | None:
    """The array with each of its object items' last open property moved to the end of their
    properties, when that makes the items `_closing_guarded_position`: the set of valid items is
    the same, only the order the engines write the properties in changes (``{"name": string,
    "enabled": boolean}`` is then written enabled first). Items behind a ``$ref`` are inlined (the
    reference's finished union, exactly what it stands for). None when that does not help."""
    items = kw["items"]
    if kw["prefix"] or items is None or items.is_any:
        return None
    leaves = _concrete_leaves(items, ctx, 0)
    if not leaves or any(leaf is ANY for leaf in leaves) or not any(leaf.kind == "object" for leaf in leaves):
        return None
    moved = U([_open_last(leaf, ctx) if leaf.kind == "object" else leaf for leaf in leaves], items.exact)
    return {**kw, "items": moved} if _closing_guarded_position(moved, ctx) else None


def _open_last(leaf: Leaf, ctx) -> Leaf:
    """`leaf` with its last fully open property moved to the end (unchanged when it has none)."""
    names = list(leaf.kw["props"])
    open_names = [name for name in names if _fully_open(leaf.kw["props"][name], ctx)]
    if not open_names:
        return leaf
    last = open_names[-1]
    props = {name: leaf.kw["props"][name] for name in names if name != last}
    props[last] = leaf.kw["props"][last]
    return leaf.replace(props=props)


def _fully_open(u: U, ctx) -> bool:
    leaves = _concrete_leaves(u, ctx, 0)
    if not leaves:
        return False
    return all(_open_leaf(leaf, ctx) for leaf in leaves)


def _closing_object_leaf(leaf, ctx) -> bool:
    """A closed object leaf whose last property takes only open values."""
    if leaf is ANY or leaf.kind != "object":
        return False
    kw = leaf.kw
    closed = kw["additional"] is not None and kw["additional"].is_none
    if not kw["props"] or not closed or kw["pprops"] or kw["max"] is not None or kw["names"]:
        return False
    return _fully_open(list(kw["props"].values())[-1], ctx)


def open_domain(u: U, ctx) -> bool:
    """True when an item of `u` being written can always still become a value no earlier item
    has, so the uniqueness guard never leaves a request without a token (`fd_guided.unique_guard`).
    It holds when at least one alternative is *open* (from any prefix of its values infinitely
    many values remain) and every other is open or a literal (``true``/``false``/``null``: the
    guard refuses to start a literal the array holds already). Open: any value; a string with no
    maximum length and at most one `pattern` or `format` whose language never dead-ends
    (`regex.extendable`: ``^[a-z]+$``, ``uri``; not ``^(a|b+)$``, ``date``); a number with no
    bounds or steps; an integer with no steps bounded only away from 0 (``minimum >= 1``), or
    unbounded (``0`` cannot go on: the guard refuses to begin a 0 the array holds); an object that admits undeclared
    properties (of any value, or of some schema that has one: another key can always be added); an
    array with no maximum whose items admit a value (another can always be appended, and lengths are
    unbounded), open items if it is unique itself."""
    leaves = _concrete_leaves(u, ctx, 0)
    if leaves is None:
        return False
    opened = [leaf for leaf in leaves if _open_leaf(leaf, ctx)]
    return bool(opened) and all(
        leaf in opened or _literal_leaf(leaf) or _subsumed_enum(leaf, opened, ctx) for leaf in leaves
    )


def _concrete_leaves(u: U, ctx, depth: int) -> list | None:
    """`u`'s leaves with references expanded ([ANY] for any value); None when unknowable."""
    if u.leaves is None:  # u.is_any
        return [ANY]
    if u.is_none or depth > 8:
        return None
    out: list = []
    for leaf in u.leaves:
        if leaf.kind != "ref":
            out.append(leaf)
            continue
        if ctx.in_progress(leaf.kw["target"]):
            raise _Pending
        try:
            expanded = _concrete_leaves(ctx.expand(leaf), ctx, depth + 1)
        except Refusal:
            return None
        if expanded is None:
            return None
        out.extend(expanded)
    return out


def _open_leaf(leaf, ctx) -> bool:
    if leaf is ANY:
        return True
    kw = leaf.kw
    if leaf.kind == "string":
        return _open_string(kw)
    if leaf.kind == "number":
        return kw["lo"] is None and kw["hi"] is None and not kw["steps"]
    if leaf.kind == "integer":  # away from 0 every prefix can take another digit; 0 itself is final
        if kw["steps"] or (kw["lo"] is not None and kw["hi"] is not None):
            return False
        if kw["lo"] is not None:
            return kw["lo"][0] >= 1
        if kw["hi"] is not None:
            return kw["hi"][0] <= -1
        return True  # the guard refuses to begin a 0 the array holds (`JsonTracker`, integer items)
    if leaf.kind == "object":  # another key (with any value undeclared keys may take) can always be added
        return (
            not kw["pprops"]
            and (kw["additional"] is None or not kw["additional"].is_none)
            and kw["max"] is None
            and not kw["names"]
        )
    if leaf.kind == "array":
        # Another item can always be appended, and lengths are unbounded: among the ways on, one
        # differs from each of the finitely many earlier items. Unique nested items need open ones.
        items = ANY if kw["items"] is None else kw["items"]
        return (
            array_max(kw) is None
            and not kw["contains"]
            and not items.is_none
            and (not kw["unique"] or _fully_open(items, ctx))
        )
    return False


def _literal_leaf(leaf) -> bool:
    if leaf is ANY:
        return False
    if leaf.kind in ("boolean", "null"):
        return True
    return leaf.kind == "enum" and all(value is None or isinstance(value, bool) for value in leaf.kw["values"])


def _subsumed_enum(leaf, opened: list, ctx) -> bool:
    """An enum whose every value is a literal or a value of an open alternative (``anyOf: [{enum:
    ["multiline"]}, {type: string}]``): the enum adds no value, so an item spelling one of them
    can still go on as the open alternative does (every prefix of a value of an extendable
    language can go on; `open_domain`)."""
    if leaf is ANY or leaf.kind != "enum":
        return False
    return all(
        value is None
        or isinstance(value, bool)
        or any(ctx.accepts(U([open_leaf]) if open_leaf is not ANY else ANY, value) for open_leaf in opened)
        for value in leaf.kw["values"]
    )


def _open_string(kw: dict) -> bool:
    if kw["max"] is not None or len(kw["patterns"]) + len(kw["formats"]) > 1:
        return False  # two languages intersected: each extendable does not make both so
    if kw["patterns"]:
        return extendable(kw["patterns"][0])
    if kw["formats"]:
        pattern = format_pattern(kw["formats"][0])
        return pattern is not None and extendable(pattern, full_match=True)
    return True


def _domain(u: U, ctx) -> list | None:
    """The values of `u` when every alternative (through $refs) is an enum, boolean or null."""
    checkpoint()  # admission's deadline: asked once per position of a long tuple
    leaves = _concrete_leaves(u, ctx, 0)
    if leaves is None:
        return None
    values = []
    for leaf in leaves:
        if leaf is ANY:
            return None
        if leaf.kind == "enum":
            values.extend(leaf.kw["values"])
        elif leaf.kind == "null":
            values.append(None)
        elif leaf.kind == "boolean":
            values.extend([True, False])
        else:
            return None
    return values


def _enumerate(domains, minimum, current, seen, out, location, visits=None) -> None:
    """Every array of distinct values, one from each of the first k `domains`, k >= `minimum`, into
    `out`; Refusal past `MAX_UNIQUE_ARRAYS` arrays or `MAX_VISITS` partial arrays (a branch that
    cannot reach `minimum` distinct values is cut, so ``minItems`` past the domain ends at once
    instead of walking every permutation)."""
    visits = visits if visits is not None else [0]
    visits[0] += 1
    if visits[0] > MAX_VISITS:
        raise Refusal(f"uniqueItems with more than {MAX_UNIQUE_ARRAYS} possible arrays", location)
    if len(current) < minimum and len(current) + _distinct_left(domains[len(current) :], seen) < minimum:
        return
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
        _enumerate(domains, minimum, current, seen, out, location, visits)
        current.pop()
        seen.discard(key)


def _distinct_left(domains, seen) -> int:
    """At most how many more distinct values the positions `domains` can add beside `seen`."""
    unused: set = set()
    for domain in domains:
        checkpoint()  # admission's deadline: the domains can hold ~10^6 values in all
        unused.update(json_key(value) for value in domain)
    return min(len(domains), len(unused - seen))
