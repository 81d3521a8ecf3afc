"""Which draft a schema is written in, each node's keywords in 2020-12 terms, and $ref resolution.

The draft is the one `jsonschema` validates with (`validator_for` on ``$schema``, 2020-12 when
absent): outputs are judged by that validator, so the normaliser reads every node as it does.
`keywords` returns a node's assertions renamed to their 2020-12 forms and drops what that draft
does not know (an unknown keyword is an annotation: ``prefixItems`` in draft 7, ``additionalItems``
or ``dependencies`` in 2020-12 are ignored by the validator, so they are ignored here):

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

DRAFT_OF_VALIDATOR = {
    "Draft4Validator": 4, "Draft6Validator": 6, "Draft7Validator": 7,
    "Draft201909Validator": 2019, "Draft202012Validator": 2020,
}
_COMMON = {
    "type", "enum", "allOf", "anyOf", "oneOf", "not", "$ref", "format",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "minLength", "maxLength", "pattern",
    "items", "minItems", "maxItems", "uniqueItems",
    "properties", "patternProperties", "additionalProperties", "required", "minProperties", "maxProperties",
}
KNOWN_KEYWORDS = {
    4: _COMMON | {"additionalItems", "dependencies"},
    6: _COMMON | {"additionalItems", "dependencies", "const", "contains", "propertyNames"},
    7: _COMMON | {"additionalItems", "dependencies", "const", "contains", "propertyNames", "if", "then", "else"},
    2019: _COMMON | {"additionalItems", "const", "contains", "minContains", "maxContains", "propertyNames", "if", "then",
                     "else", "dependentRequired", "dependentSchemas", "unevaluatedItems", "unevaluatedProperties",
                     "$recursiveRef"},
    2020: _COMMON | {"prefixItems", "const", "contains", "minContains", "maxContains", "propertyNames", "if", "then",
                     "else", "dependentRequired", "dependentSchemas", "unevaluatedItems", "unevaluatedProperties",
                     "$dynamicRef"},
}


def validator_class(schema: Any):
    """The `jsonschema` validator class that judges outputs of `schema` (as fd_guided.harness.validate does)."""
    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)


class Document:
    """One schema document: its draft, its reference resolver and its canonical keyword view."""

    def __init__(self, schema: Any):
        self.schema = schema
        self.validator_class = validator_class(schema)
        self.draft = DRAFT_OF_VALIDATOR.get(self.validator_class.__name__, 2020)
        meta = self.validator_class.META_SCHEMA
        self.specification = referencing.jsonschema.specification_with(meta.get("$id") or meta.get("id"))
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
            raise Refusal(f"$ref {ref[:80]!r} outside this document (remote references are not fetched)", location) from None
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
        if draft == 4:
            for bound, excl in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
                flag = out.pop(excl, False)
                if flag is True and bound in out:
                    out[excl] = out.pop(bound)
        if draft <= 2019:
            items = out.get("items")
            additional = out.pop("additionalItems", None)
            if isinstance(items, list):
                out["prefixItems"] = out.pop("items")
                if additional is not None:
                    out["items"] = additional
        if draft <= 7 and "dependencies" in out:
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


def base_uri(resolver) -> str:
    """The base URI a resolver resolves against (part of the memo key of a normalised node)."""
    return getattr(resolver, "_base_uri", "")


def first_unresolvable_reference(schema: Any) -> tuple[str, str] | None:
    """(ref, location) of the first ``$ref`` in a schema position that does not resolve inside the
    document (remote, or a dangling pointer), or None. Iterative; each node's base URI honoured."""
    from .walk import subschemas

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
