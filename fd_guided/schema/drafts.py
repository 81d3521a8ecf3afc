"""Which draft a schema is written in, each node's keywords in 2020-12 terms, and $ref resolution.

With ``$schema`` the draft is the one `jsonschema` validates with (`validator_for`), and `keywords`
returns a node's assertions renamed to their 2020-12 forms, dropping what that draft does not know
(an unknown keyword is an annotation: ``prefixItems`` in draft 7, ``additionalItems`` or
``dependencies`` in 2020-12 are ignored by its validator, so they are ignored here).

Without ``$schema`` (what clients send: the OpenAI API, pydantic, hand-written schemas) no keyword
is dropped that some draft asserts: each is read by the draft that defines it (``dependencies``,
``items: [..]`` with ``additionalItems``, boolean ``exclusiveMinimum``/``exclusiveMaximum`` and
``id`` as drafts 4-7 read them; ``$ref`` siblings, ``prefixItems``, ``dependentSchemas`` as 2019-09
and 2020-12 do). That reading is the conjunction of every draft under which the document is valid
(`validators_for`: what outputs are judged by); where two drafts' readings disagree rather than add
up (``items: [..]`` beside ``prefixItems``, a ``$ref`` beside ``$id``, ``id`` and ``$id`` that move
a reference to different targets, one name in both ``dependencies`` and ``dependentSchemas``) the
schema is refused naming the conflict (`Refusal`; ``$schema`` settles it). Per draft:

  - draft 4: boolean ``exclusiveMinimum``/``exclusiveMaximum`` become the numeric forms;
  - drafts 4-7: ``$ref`` hides its siblings; ``dependencies`` splits into ``dependentRequired`` and
    ``dependentSchemas``; drafts 4-2019-09: ``items: [..]`` is ``prefixItems`` and ``additionalItems``
    is then ``items`` (ignored when ``items`` is one schema);
  - ``minContains``/``maxContains`` exist from 2019-09, ``if``/``then``/``else`` from 7, ``const``,
    ``contains`` and ``propertyNames`` from 6.

References resolve with `referencing` (the library `jsonschema` uses) over this one document:
``$id``, ``$anchor`` and JSON pointers resolve; anything outside the document is a `Refusal`
(no network). ``$dynamicRef``/``$recursiveRef`` resolve statically only where the document leaves
one possible target.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import referencing
import referencing.exceptions
import referencing.jsonschema

from .refusal import Refusal
from .walk import subschemas

DRAFT_OF_VALIDATOR = {
    "Draft4Validator": 4,
    "Draft6Validator": 6,
    "Draft7Validator": 7,
    "Draft201909Validator": 2019,
    "Draft202012Validator": 2020,
}
_COMMON = {
    "type",
    "enum",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "$ref",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "pattern",
    "items",
    "minItems",
    "maxItems",
    "uniqueItems",
    "properties",
    "patternProperties",
    "additionalProperties",
    "required",
    "minProperties",
    "maxProperties",
}
KNOWN_KEYWORDS = {
    4: _COMMON | {"additionalItems", "dependencies"},
    6: _COMMON | {"additionalItems", "dependencies", "const", "contains", "propertyNames"},
    7: _COMMON | {"additionalItems", "dependencies", "const", "contains", "propertyNames", "if", "then", "else"},
    2019: _COMMON
    | {
        "additionalItems",
        "const",
        "contains",
        "minContains",
        "maxContains",
        "propertyNames",
        "if",
        "then",
        "else",
        "dependentRequired",
        "dependentSchemas",
        "unevaluatedItems",
        "unevaluatedProperties",
        "$recursiveRef",
    },
    2020: _COMMON
    | {
        "prefixItems",
        "const",
        "contains",
        "minContains",
        "maxContains",
        "propertyNames",
        "if",
        "then",
        "else",
        "dependentRequired",
        "dependentSchemas",
        "unevaluatedItems",
        "unevaluatedProperties",
        "$dynamicRef",
    },
}
# The `draft` of a document without $schema: each keyword read by the draft that defines it. Past every
# draft's number, so a reader asking `draft >= 2019` (annotations, unevaluated*) reads it as the newest.
INFERRED = 9999
KNOWN_KEYWORDS[INFERRED] = set().union(*KNOWN_KEYWORDS.values())
VALIDATORS = (
    jsonschema.Draft4Validator,
    jsonschema.Draft6Validator,
    jsonschema.Draft7Validator,
    jsonschema.Draft201909Validator,
    jsonschema.Draft202012Validator,
)
_NO_CONFLICT = "set $schema to say which draft is meant"


def declares_draft(schema: Any) -> bool:
    return isinstance(schema, dict) and "$schema" in schema


def validators_for(schema: Any) -> list:
    """The `jsonschema` validator classes whose verdicts, all together, judge outputs of `schema`:
    its ``$schema``'s one, or without it every draft under which the document is valid (their
    conjunction is the reading of the module docstring)."""
    if declares_draft(schema):
        return [validator_class(schema)]
    valid = [cls for cls in VALIDATORS if meta_valid(cls, schema)]
    return valid or [jsonschema.Draft202012Validator]


def meta_valid(cls, schema: Any) -> bool:
    """`schema` valid against `cls`'s meta-schema, formats (``regex``: Python's re) checked as
    `check_schema` checks them."""
    try:
        return cls(cls.META_SCHEMA, format_checker=cls.FORMAT_CHECKER).is_valid(schema)
    except RecursionError:
        return False


def validator_class(schema: Any):
    """The `jsonschema` validator class that judges outputs of `schema` (as fd_guided.harness.validate does)."""
    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)


class Document:
    """One schema document: its draft, its reference resolver and its canonical keyword view."""

    def __init__(self, schema: Any):
        self.schema = schema
        self.validator_class = validator_class(schema)
        self.inferred = not declares_draft(schema)
        self.draft = INFERRED if self.inferred else DRAFT_OF_VALIDATOR.get(self.validator_class.__name__, 2020)
        meta = self.validator_class.META_SCHEMA
        self.specification = referencing.jsonschema.specification_with(meta.get("$id") or meta.get("id"))
        if self.inferred and _identifiers(schema)[0]:
            # draft 4's `id`: read as drafts 4-6 read it, where no reference lands elsewhere for it
            self.specification = _legacy_id_specification(schema, self.specification)
        resource = self.specification.create_resource(schema)
        self.root_resolver = referencing.Registry().resolver_with_root(resource)
        self._dynamic_anchors: dict[str, int] | None = None

    def enter(self, node: Any, resolver):
        """The resolver inside `node` (a node with its own ``$id`` changes the base URI)."""
        if not isinstance(node, dict):
            return resolver
        try:
            return resolver.in_subresource(self.specification.create_resource(node))
        except Exception as error:  # noqa: BLE001 - malformed identifiers in user input
            # e.g. draft 4's "id" holding an object (a property named "id" one level too high):
            # jsonschema itself fails on it, so no output could be checked against the schema.
            raise Refusal(f"an identifier (id/$id/$anchor) that is not a string ({type(error).__name__})") from None

    def lookup(self, ref: str, resolver, location: str):
        """(target node, its resolver) for a reference; Refusal if it leaves the document."""
        try:
            resolved = resolver.lookup(ref)
        except referencing.exceptions.Unresolvable:
            raise Refusal(
                f"$ref {ref[:80]!r} outside this document (remote references are not fetched)", location
            ) from None
        except Exception as error:  # noqa: BLE001 - a malformed pointer or URI in user input
            raise Refusal(f"$ref {ref[:80]!r} that cannot be resolved ({type(error).__name__})", location) from None
        return resolved.contents, resolved.resolver

    def keywords(self, node: dict, location: str) -> dict:
        """`node`'s assertions in 2020-12 terms (module docstring); unknown keywords dropped."""
        draft = self.draft
        known = KNOWN_KEYWORDS[draft]
        if "$ref" in node and draft <= 7:
            return {"$ref": node["$ref"]}
        out = {key: value for key, value in node.items() if key in known}
        if draft == INFERRED:
            out = _inferred_keywords(node, out, location)
        if draft == 4:
            for bound, excl in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
                flag = out.pop(excl, False)
                if flag is True and bound in out:
                    out[excl] = out.pop(bound)
        if draft <= 2019:  # (INFERRED read these above)
            items = out.get("items")
            additional = out.pop("additionalItems", None)
            if isinstance(items, list):
                out["prefixItems"] = out.pop("items")
                if additional is not None:
                    out["items"] = additional
        if draft <= 7 and "dependencies" in out:  # (INFERRED: above)
            dependencies = out.pop("dependencies")
            if isinstance(dependencies, dict):
                required = {k: v for k, v in dependencies.items() if isinstance(v, list)}
                schemas = {k: v for k, v in dependencies.items() if not isinstance(v, list)}
                if required:
                    out["dependentRequired"] = required
                if schemas:
                    out["dependentSchemas"] = schemas
        if "$dynamicRef" in out:
            out["$ref"] = self._static_dynamic_ref(out.pop("$dynamicRef"), location)
        if "$recursiveRef" in out:
            out["$ref"] = self._static_recursive_ref(out.pop("$recursiveRef"), location)
        return out

    def _static_dynamic_ref(self, ref: Any, location: str) -> Any:
        """A ``$dynamicRef`` is a plain ``$ref`` when its fragment names at most one dynamic anchor."""
        if not isinstance(ref, str):
            return ref
        name = ref.partition("#")[2]
        if self._anchor_counts().get(name, 0) > 1:
            raise Refusal("$dynamicRef with several possible targets", f"{location}.$dynamicRef")
        return ref

    def _static_recursive_ref(self, ref: Any, location: str) -> Any:
        if self._anchor_counts().get("$recursiveAnchor", 0) > 0:
            raise Refusal("$recursiveRef with $recursiveAnchor", f"{location}.$recursiveRef")
        return ref

    def _anchor_counts(self) -> dict[str, int]:
        if self._dynamic_anchors is None:
            counts: dict[str, int] = {}
            stack = [self.schema]
            while stack:
                node = stack.pop()
                if isinstance(node, dict):
                    anchor = node.get("$dynamicAnchor")
                    if isinstance(anchor, str):
                        counts[anchor] = counts.get(anchor, 0) + 1
                    if node.get("$recursiveAnchor") is True:
                        counts["$recursiveAnchor"] = counts.get("$recursiveAnchor", 0) + 1
                    stack.extend(node.values())
                elif isinstance(node, list):
                    stack.extend(node)
            self._dynamic_anchors = counts
        return self._dynamic_anchors


def _inferred_keywords(node: dict, out: dict, location: str) -> dict:
    """A node of a document without $schema: every draft's assertions (module docstring)."""
    if "$ref" in node and isinstance(node.get("$id"), str):
        raise Refusal(
            f"$ref beside $id without $schema (drafts 4-7 resolve it against the enclosing base URI, 2019-09 and "
            f"later against this $id; {_NO_CONFLICT})",
            f"{location}.$ref",
        )
    for bound, excl in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if isinstance(out.get(excl), bool):  # draft 4's boolean form (6 and later take a number)
            if out.pop(excl) and bound in out:
                out[excl] = out.pop(bound)
    items = out.get("items")
    additional = out.pop("additionalItems", None)
    if isinstance(items, list):
        if "prefixItems" in out:
            raise Refusal(
                f"items as an array (drafts 4 to 2019-09) beside prefixItems (2020-12) without $schema; {_NO_CONFLICT}",
                f"{location}.items",
            )
        out["prefixItems"] = out.pop("items")
        if additional is not None:
            out["items"] = additional
    dependencies = out.pop("dependencies", None)
    if isinstance(dependencies, dict):
        for name, value in dependencies.items():
            target = "dependentRequired" if isinstance(value, list) else "dependentSchemas"
            merged = dict(out.get(target) or {})
            if name in (out.get("dependentRequired") or {}) or name in (out.get("dependentSchemas") or {}):
                raise Refusal(
                    f"dependencies (drafts 4-7) and dependentRequired/dependentSchemas (2019-09 and later) both "
                    f"name {name[:60]!r} without $schema; {_NO_CONFLICT}",
                    f"{location}.dependencies",
                )
            merged[name] = value
            out[target] = merged
    return out


def _identifiers(schema: Any) -> tuple[bool, bool]:
    """(a draft-4 ``id`` identifies a subschema, a ``$id``/``$anchor`` does), by keyword position."""
    legacy = modern = False
    stack = [schema]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        legacy = legacy or (isinstance(node.get("id"), str) and "$id" not in node)
        modern = modern or isinstance(node.get("$id"), str) or isinstance(node.get("$anchor"), str)
        stack.extend(child for child, _ in subschemas(node))
    return legacy, modern


def _legacy_id_specification(schema: Any, modern):
    """Draft 4's reading of ``id`` where it changes no reference's target against 2019-09/2020-12's
    (which ignore ``id``); a Refusal naming the reference otherwise, or when ``$id`` is used too."""
    legacy = referencing.jsonschema.DRAFT4
    if _identifiers(schema)[1]:
        raise Refusal(
            f"both id (draft 4) and $id/$anchor (draft 6 and later) identify subschemas without $schema; "
            f"{_NO_CONFLICT}",
            "$",
        )
    targets = [_reference_targets(schema, specification) for specification in (legacy, modern)]
    for where, target in targets[0].items():
        if targets[1].get(where, target) is not target:
            raise Refusal(
                f"a $ref that draft 4's id and later drafts resolve to different subschemas without $schema; "
                f"{_NO_CONFLICT}",
                where,
            )
    return legacy


def _reference_targets(schema: Any, specification) -> dict[str, Any]:
    """Location of each local ``$ref`` -> the node it resolves to under `specification` (None: none)."""
    resolver = referencing.Registry().resolver_with_root(specification.create_resource(schema))
    out: dict[str, Any] = {}
    stack = [(schema, "$", resolver)]
    seen: set[int] = set()
    while stack:
        node, where, resolver = stack.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        try:
            resolver = resolver.in_subresource(specification.create_resource(node))
        except Exception:  # noqa: BLE001 - a malformed identifier: Document.enter refuses it
            pass
        if isinstance(node.get("$ref"), str):
            try:
                out[f"{where}.$ref"] = resolver.lookup(node["$ref"]).contents
            except Exception:  # noqa: BLE001 - unresolvable under this reading
                out[f"{where}.$ref"] = None
        stack.extend((child, path, resolver) for child, path in subschemas(node, where))
    return out


def base_uri(resolver) -> str:
    """The base URI a resolver resolves against (part of the memo key of a normalised node)."""
    return getattr(resolver, "_base_uri", "")


def first_unresolvable_reference(schema: Any) -> tuple[str, str] | None:
    """(ref, location) of the first ``$ref`` in a schema position that does not resolve inside the
    document (remote, or a dangling pointer), or None. Iterative; each node's base URI honoured."""
    document = Document(schema)
    stack = [(schema, "$", document.root_resolver)]
    seen: set[int] = set()
    while stack:
        node, where, resolver = stack.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        resolver = document.enter(node, resolver)
        for keyword in ("$ref", "$dynamicRef", "$recursiveRef"):
            ref = node.get(keyword)
            if isinstance(ref, str):
                try:
                    resolver.lookup(ref)
                except Exception:  # noqa: BLE001 - Unresolvable, or a malformed URI/pointer in user input
                    return ref, f"{where}.{keyword}"
        stack.extend((child, path, resolver) for child, path in subschemas(node, where))
    return None
