"""The normaliser: one schema document -> a union of typed leaves (`fd_guided.schema.leaves`).

Each node is read through its draft (`drafts.Document.keywords`) and becomes the intersection of
its parts: the leaves of its types (one per allowed type, carrying only that type's keywords;
`type_part`), ``enum``/``const``, ``$ref``, every ``allOf`` branch, the union of ``anyOf``,
``oneOf`` (`rules`), ``not`` (`complement`), ``if``/``then``/``else`` and the dependencies
(`rules`). Then ``unevaluatedProperties``/``unevaluatedItems`` apply to each resulting leaf, whose
evaluated set is now static (`rules.apply_unevaluated`). At *value positions* (the root, property
values, items, ...) the union is then *closed* (strict mode) and *finished* (rewrites that need the
final leaf: ``required`` names declared, ``propertyNames``, ``contains``, ``uniqueItems``; `finish`).

Costs are bounded: each node is normalised once per base URI (memoised), unions hold at most
`leaves.MAX_LEAVES` alternatives, a work budget caps merges, and nesting through in-place
references is capped (`MAX_DEPTH`); going past any bound is a `Refusal`, never a hang.
"""

from __future__ import annotations

import threading
from typing import Any

from . import rules
from .complement import complement
from .deadline import checkpoint
from .drafts import Document, base_uri
from .instance import accepts
from .intersection import Context, check_array, deeply_exact, intersect, with_required_declared
from .leaves import ALL_KINDS, ANY, NONE, STRICT_CLOSED, Leaf, U, kind_of, unique_values
from .one_of import one_of
from .refusal import Refusal, Unsatisfiable
from .type_part import type_part

MAX_DEPTH = 150
MAX_WORK = 200_000


class Normaliser(Context):
    """Normalises one document for one request layout (`strict`, `unknown_formats`, and
    `unique_guard`: ``uniqueItems`` over open item domains is left to `fd_guided.unique_guard`;
    ``"any_order"`` says so too, for a request whose object properties may come in any order)."""

    def __init__(
        self, schema: Any, *, strict: bool = True, unknown_formats: str = "refuse", unique_guard: bool | str = False
    ):
        self.doc = Document(schema)
        self.strict = strict
        self.unknown_formats = unknown_formats
        self.unique_guard = bool(unique_guard)
        self.ordered_objects = unique_guard != "any_order"
        self.targets: dict[tuple, tuple] = {}
        self._memo: dict[tuple, U] = {}
        self._closed: dict[tuple, U] = {}
        self._active: set[tuple] = set()
        self._depth = 0
        self._work = 0
        self.complement_depth = 0  # see complement.MAX_COMPLEMENT_DEPTH
        self.complementing: set[tuple] = set()  # ref targets whose complement is being written
        self.lock = threading.Lock()
        self.interrupted = False  # set when admission's deadline stopped it: never reused then
        self._checker = self.doc.validator_class.FORMAT_CHECKER
        text = repr(schema) if self.doc.draft >= 2019 else ""
        self._reads_annotations = "unevaluatedProperties" in text or "unevaluatedItems" in text

    # ----- Context ------------------------------------------------------------------------------

    def spend(self, amount: int = 1) -> None:
        checkpoint()  # admission's deadline (`fd_guided.schema.deadline`); never raises in workers
        self._work += amount
        if self._work > MAX_WORK:
            raise Refusal("a schema whose combinations are too expensive to normalise")

    def in_progress(self, key: tuple) -> bool:
        return key in self._active

    def expand(self, leaf: Leaf) -> U:
        key = leaf.kw["target"]
        node, resolver, path = self.targets[key]
        if key in self._active:
            raise Refusal("a recursive $ref that has to be combined with other keywords", path)
        if not leaf.kw["closed"]:
            return self.norm(node, resolver, path)
        if key not in self._closed:
            self._closed[key] = self.finish(self.close(self.norm(node, resolver, path)))
        return self._closed[key]

    def accepts(self, u: U, value: Any) -> bool:
        checkpoint()  # admission's deadline: enums are filtered value by value
        return accepts(u, value, self.expand, self._format_ok)

    def _format_ok(self, value: str, fmt: str) -> bool:
        return self._checker.conforms(value, fmt)

    def ref_kinds(self, key: tuple) -> frozenset:
        """The JSON types (``integer`` read as ``number``) a reference target's values may have,
        read from the raw schema (`type`, `enum`/`const`, `$ref`, `allOf`, `anyOf`/`oneOf`) without
        normalising it, so it works inside a recursion too; an over-approximation (every type where
        unsure). `one_of.one_of` proves branches disjoint with it before intersecting them."""
        node, resolver, path = self.targets[key]
        return self._raw_kinds(node, resolver, path, frozenset())

    def _raw_kinds(self, node: Any, resolver, path: str, seen: frozenset) -> frozenset:
        if node is False:
            return frozenset()
        if not isinstance(node, dict) or id(node) in seen or len(seen) > 64:
            return ALL_KINDS
        seen = seen | {id(node)}
        try:
            resolver = self.doc.enter(node, resolver)
            kw = self.doc.keywords(node, path)
            kinds = ALL_KINDS
            types = kw.get("type")
            if isinstance(types, str):
                types = [types]
            if isinstance(types, list):
                kinds &= frozenset("number" if t == "integer" else t for t in types if isinstance(t, str))
            for values in (
                [kw["const"]] if "const" in kw else None,
                kw.get("enum") if isinstance(kw.get("enum"), list) else None,
            ):
                if values is not None:
                    kinds &= frozenset(kind_of(value) for value in values)
            if isinstance(kw.get("$ref"), str):
                target, target_resolver = self.doc.lookup(kw["$ref"], resolver, path)
                kinds &= self._raw_kinds(target, target_resolver, path, seen)
            for part in kw.get("allOf") or ():
                kinds &= self._raw_kinds(part, resolver, path, seen)
            for combinator in ("anyOf", "oneOf"):
                if isinstance(kw.get(combinator), list):
                    kinds &= frozenset().union(
                        *(self._raw_kinds(part, resolver, path, seen) for part in kw[combinator])
                    )
            return kinds
        except Refusal:
            return ALL_KINDS

    # ----- entry points ---------------------------------------------------------------------------

    def root(self) -> U:
        return self.value(self.doc.schema, self.doc.root_resolver, "$")

    def value(self, node: Any, resolver, path: str) -> U:
        """The union at a value position: normalised, closed (strict), finished."""
        return self.finish(self.close(self.norm(node, resolver, path)))

    def norm(self, node: Any, resolver, path: str) -> U:
        """The (open, in-place) union of a schema node; memoised per node and base URI."""
        if node is True:
            return ANY
        if node is False:
            return NONE
        if not isinstance(node, dict):
            raise Refusal(f"a subschema of type {type(node).__name__}", path)
        resolver = self.doc.enter(node, resolver)
        key = (id(node), base_uri(resolver))
        cached = self._memo.get(key)
        if cached is not None:
            return cached
        if key in self._active:
            raise Refusal("a recursive $ref that has to be combined with other keywords", path)
        if self._depth >= MAX_DEPTH:
            raise Refusal(f"a schema nested more than {MAX_DEPTH} levels deep (through $ref)", path)
        self._active.add(key)
        self._depth += 1
        try:
            result = self._norm_node(node, resolver, path)
        finally:
            self._depth -= 1
            self._active.discard(key)
        self._memo[key] = result
        return result

    # ----- one node -------------------------------------------------------------------------------

    def _norm_node(self, node: dict, resolver, path: str) -> U:
        self.spend()
        kw = self.doc.keywords(node, path)
        parts: list[U] = []
        if "const" in kw:
            parts.append(self._enum([kw["const"]], path))
        if "enum" in kw:
            parts.append(self._enum(kw["enum"], path))
        parts.append(type_part(kw, resolver, self, path))
        if "$ref" in kw:
            parts.append(self._ref(kw["$ref"], resolver, path))
        one_ofs = []  # (branches, where): this node's oneOf and those of its bare-oneOf allOf parts
        for index, branch in enumerate(kw.get("allOf") or []):
            where = f"{path}.allOf[{index}]"
            inner = self._bare_one_of(branch, resolver, where)
            if inner is not None:
                one_ofs.append(inner)
            else:
                parts.append(self.norm(branch, resolver, where))
        if "anyOf" in kw:
            branches = [self.norm(b, resolver, f"{path}.anyOf[{i}]") for i, b in enumerate(kw["anyOf"])]
            parts.append(rules.any_of(branches, self, self._reads_annotations))
        if "oneOf" in kw:
            one_ofs.append(
                ([self.norm(b, resolver, f"{path}.oneOf[{i}]") for i, b in enumerate(kw["oneOf"])], f"{path}.oneOf")
            )
        for branches, where in one_ofs:
            context = ANY  # what the keywords so far require: the branches are judged inside it
            for part in parts:
                context = intersect(context, part, self)
            parts = [one_of(branches, self, where, context)]
        if "not" in kw:
            parts.append(complement(self.norm(kw["not"], resolver, f"{path}.not"), self, f"{path}.not"))
        if "if" in kw:
            parts.append(rules.if_then_else(kw, resolver, self, path))
        for name, deps in (kw.get("dependentRequired") or {}).items():
            parts.append(rules.dependent_required(name, deps, path))
        for name, sub in (kw.get("dependentSchemas") or {}).items():
            parts.append(
                rules.dependent_schema(name, self.norm(sub, resolver, f"{path}.dependentSchemas.{name}"), self, path)
            )
        result = ANY
        for part in parts:
            result = intersect(result, part, self)
            if result.is_none:
                break
        return rules.apply_unevaluated(kw, result, resolver, self, path)

    def _bare_one_of(self, node: Any, resolver, path: str) -> tuple[list[U], str] | None:
        """The normalised branches of an allOf part that asserts nothing but a ``oneOf``
        (``allOf: [{$ref: kind_pipeline}, {oneOf: [docker, exec, ...]}]``), so that the node
        judges them inside its other keywords, as its own ``oneOf`` (`one_of.one_of`: the
        ``type`` that kind_pipeline requires and each branch gives a ``const`` tells them apart).
        ``A ∧ (B ∧ oneOf(C))`` is ``(A ∧ B) ∧ oneOf(C)``: the same value set. None otherwise."""
        if not isinstance(node, dict):
            return None
        inner_resolver = self.doc.enter(node, resolver)
        kw = self.doc.keywords(node, path)
        if set(kw) != {"oneOf"} or not isinstance(kw["oneOf"], list) or not kw["oneOf"]:
            return None
        self.spend()
        return [self.norm(b, inner_resolver, f"{path}.oneOf[{i}]") for i, b in enumerate(kw["oneOf"])], f"{path}.oneOf"

    def _enum(self, values: list, path: str) -> U:
        canonical = [int(v) if isinstance(v, float) and v.is_integer() and abs(v) < 2**63 else v for v in values]
        kept = unique_values(canonical)
        return U([Leaf("enum", {"values": kept}, path)]) if kept else NONE

    def _ref(self, ref: Any, resolver, path: str) -> U:
        """A ref leaf for the target; chains of pure ``{"$ref": ...}`` aliases are followed here, in a loop."""
        if not isinstance(ref, str):
            raise Refusal("a $ref that is not a string", path)
        where = f"{path}.$ref"
        node, target_resolver = self.doc.lookup(ref, resolver, where)
        seen: set[tuple] = set()
        while True:
            if node is True or node is False:
                return ANY if node else NONE
            if not isinstance(node, dict):
                raise Refusal(f"$ref {ref!r} to a value that is not a schema", where)
            target_resolver = self.doc.enter(node, target_resolver)
            key = (id(node), base_uri(target_resolver))
            kw = self.doc.keywords(node, where)
            if set(kw) != {"$ref"} or not isinstance(kw["$ref"], str):
                break
            if key in seen:
                raise Unsatisfiable("$refs that only refer to each other", where)
            seen.add(key)
            self.spend()
            node, target_resolver = self.doc.lookup(kw["$ref"], target_resolver, where)
        self.targets.setdefault(key, (node, target_resolver, _ref_path(ref)))
        return U([Leaf("ref", {"target": key, "closed": False}, path)])

    # ----- value positions ------------------------------------------------------------------------

    def close(self, u: U) -> U:
        """Marks refs as used at a value position (their target is finished there) and, in strict
        mode, closes: a declared object admits no undeclared property, a declared tuple no extra item."""
        if u.leaves is None:
            return u
        out, exact = [], u.exact
        for leaf in u.leaves:
            kw = leaf.kw
            if leaf.kind == "ref":
                out.append(leaf.replace(closed=True))
                continue
            if not self.strict:
                out.append(leaf)
                continue
            # The closure is `STRICT_CLOSED` (a NONE_APPROX): strict mode narrows, and a complement
            # or a disjointness proof over this value must not read it as JSON Schema's `false`.
            if leaf.kind == "object" and kw["declared"] and kw["additional"] is None and not kw["ann_rest"]:
                # Required names count as declared: strictness closes the object to the others.
                props = with_required_declared(kw["props"], kw["required"], kw["pprops"])
                leaf = leaf.replace(props=props, additional=STRICT_CLOSED)
            elif leaf.kind == "array" and kw["declared"] and kw["items"] is None and not kw["ann_items"]:
                if check_array({**kw, "items": STRICT_CLOSED}) is None:
                    exact = False  # a tuple with too few positions for minItems: empty only when closed
                    continue
                # The length bound the closure implies stays implicit: a maxItems written here would
                # read as the schema's own to a complement.
                leaf = leaf.replace(items=STRICT_CLOSED)
            out.append(leaf)
        return _same_or_new(u, out, exact)

    def finish(self, u: U) -> U:
        """Rewrites that need the final leaf (see `rules.finish_leaf`); weak leaves that cannot be
        expressed are dropped (the union becomes a subset), others refuse."""
        if u.leaves is None:
            return u
        out, exact = [], u.exact
        for leaf in u.leaves:
            try:
                finished = rules.finish_leaf(leaf, self)
            except Refusal:
                if not leaf.weak:
                    raise
                exact = False
                continue
            if not finished and not deeply_exact(U([leaf]), self):
                exact = False  # found empty by judging a subset (a closed child, say)
            out.extend(finished)
        return _same_or_new(u, out, exact)


def _same_or_new(u: U, leaves: list, exact: bool) -> U:
    """`u` itself when closing/finishing changed nothing (it keeps what it knows, such as
    `negation_of`), else a union of the new leaves."""
    assert u.leaves is not None  # callers return ANY unchanged
    if (
        exact == u.exact
        and len(leaves) == len(u.leaves)
        and all(a is b or (a.kind == b.kind and a.weak == b.weak and a.kw == b.kw) for a, b in zip(leaves, u.leaves))
    ):
        return u
    return U(leaves, exact)


def _ref_path(ref: str) -> str:
    """Where a referenced schema lives, for messages: ``#/$defs/a`` -> ``$.$defs.a``."""
    if ref == "#":
        return "$"
    if ref.startswith("#/"):
        return "$." + ".".join(t.replace("~1", "/").replace("~0", "~") for t in ref[2:].split("/"))
    return f"$ref {ref[:80]}"
