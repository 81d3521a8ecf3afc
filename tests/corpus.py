"""Real-looking constraints for the conformance tests: JSON schemas, regexes, choices, grammars.

Each schema keeps strings bounded or patterned where a real API would, so a random-weight model
under the mask finishes within the token budget most of the time; unbounded cases are included
too (they may end with ``length``, which the tests accept and check separately).
"""

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 130}},
        "required": ["name", "age"],
    },
    "nested_address": {
        "type": "object",
        "properties": {
            "user": {"type": "object", "properties": {"id": {"type": "integer"}, "handle": {"type": "string", "pattern": "^@[a-z]{3,8}$"}},
                     "required": ["id", "handle"]},
            "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                        "required": ["city", "zip"]},
        },
        "required": ["user", "address"],
    },
    "bounded_array": {"type": "array", "items": {"type": "integer", "minimum": -50, "maximum": 50}, "minItems": 2, "maxItems": 4},
    "enum_status": {"type": "object", "properties": {"status": {"enum": ["active", "suspended", "deleted"]}}, "required": ["status"]},
    "const_version": {"type": "object", "properties": {"version": {"const": "v2"}, "ok": {"type": "boolean"}}, "required": ["version", "ok"]},
    "anyof_id": {"type": "object", "properties": {"id": {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": "^[a-f0-9]{8}$"}]}}, "required": ["id"]},
    "oneof_shape": {
        "oneOf": [
            {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number", "minimum": 0}}, "required": ["kind", "r"]},
            {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer", "minimum": 1}}, "required": ["kind", "side"]},
        ]
    },
    "defs_ref": {
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x", "y"]}},
        "type": "object",
        "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
        "required": ["start", "end"],
    },
    "definitions_ref": {
        "definitions": {"tag": {"type": "string", "enum": ["red", "green", "blue"]}},
        "type": "array", "items": {"$ref": "#/definitions/tag"}, "maxItems": 3,
    },
    "recursive_tree": {
        "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
                                                           "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
                           "required": ["v"]}},
        "$ref": "#/$defs/node",
    },
    "string_pattern": {"type": "object", "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}}, "required": ["sku"]},
    "format_date": {"type": "object", "properties": {"day": {"type": "string", "format": "date"}}, "required": ["day"]},
    "format_email": {"type": "object", "properties": {"email": {"type": "string", "format": "email"}}, "required": ["email"]},
    "format_uuid": {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"}}, "required": ["id"]},
    "format_ipv4": {"type": "object", "properties": {"ip": {"type": "string", "format": "ipv4"}}, "required": ["ip"]},
    "format_datetime": {"type": "object", "properties": {"at": {"type": "string", "format": "date-time"}}, "required": ["at"]},
    "numeric_bounds": {
        "type": "object",
        "properties": {"temp": {"type": "number", "minimum": -40, "maximum": 60}, "count": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}},
        "required": ["temp", "count"],
    },
    "integer_multiple": {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100}}, "required": ["n"]},
    "nullable": {"type": "object", "properties": {"note": {"type": ["string", "null"], "maxLength": 10}}, "required": ["note"]},
    "string_lengths": {"type": "object", "properties": {"code": {"type": "string", "minLength": 3, "maxLength": 6}}, "required": ["code"]},
    "tuple_prefix": {"type": "array", "prefixItems": [{"type": "string", "maxLength": 8}, {"type": "integer"}, {"type": "boolean"}], "items": False},
    "optional_props": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}, "c": {"enum": [1, 2, 3]}},
        "required": ["a"],
    },
    "additional_typed": {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 2},
    "min_max_props": {"type": "object", "additionalProperties": {"type": "boolean"}, "minProperties": 1, "maxProperties": 2},
    "tool_call": {
        "type": "object",
        "properties": {"name": {"enum": ["get_weather", "get_time"]},
                       "arguments": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["c", "f"]}},
                                     "required": ["city"]}},
        "required": ["name", "arguments"],
    },
    "array_of_objects": {
        "type": "array",
        "items": {"type": "object", "properties": {"k": {"type": "string", "pattern": "^[a-z]{1,4}$"}, "v": {"type": "number"}}, "required": ["k", "v"]},
        "minItems": 1, "maxItems": 3,
    },
    "nested_arrays": {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 3}, "maxItems": 3},
    "enum_mixed": {"enum": ["yes", "no", 0, 1, None, True]},
    "boolean_flags": {"type": "object", "properties": {"x": {"type": "boolean"}, "y": {"type": "boolean"}}, "required": ["x", "y"]},
    "deep_nesting": {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {"c": {"type": "object",
                       "properties": {"d": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["d"]}}, "required": ["c"]}}, "required": ["b"]}},
        "required": ["a"],
    },
    "allof_single": {"allOf": [{"type": "object", "properties": {"z": {"type": "integer"}}, "required": ["z"]}]},
    "unbounded_strings": {"type": "object", "properties": {"title": {"type": "string"}, "body": {"type": "string"}}, "required": ["title", "body"]},
    "invoice": {
        "type": "object",
        "properties": {
            "invoice_id": {"type": "string", "pattern": "^INV-[0-9]{4}$"},
            "currency": {"enum": ["USD", "EUR", "CNY"]},
            "lines": {"type": "array", "minItems": 1, "maxItems": 2,
                      "items": {"type": "object", "properties": {"qty": {"type": "integer", "minimum": 1, "maximum": 9},
                                                                 "price": {"type": "number", "minimum": 0}}, "required": ["qty", "price"]}},
            "paid": {"type": "boolean"},
        },
        "required": ["invoice_id", "currency", "lines", "paid"],
    },
}

REGEXES = {
    "iso_date": r"(19|20)\d{2}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",
    "email": r"[a-z]{1,8}@[a-z]{1,8}\.(com|org|net)",
    "phone": r"\+?[0-9]{2,3}-[0-9]{3}-[0-9]{4}",
    "hex_color": r"#[0-9a-fA-F]{6}",
    "ipv4": r"((25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(25[0-5]|2[0-4]\d|1?\d?\d)",
    "yes_no": r"(yes|no)",
    "semver": r"[0-9]{1,2}\.[0-9]{1,2}\.[0-9]{1,2}",
    "identifier": r"[a-zA-Z_][a-zA-Z0-9_]{0,15}",
}

CHOICES = {
    "sentiment": ["positive", "negative", "neutral"],
    "unicode": ["是", "否", "café", "naïve"],
    "quotes_and_escapes": ['say "hi"', "back\\slash", "tab\tin"],
    "shared_prefix": ["New York", "New Jersey", "Newark"],
}

GRAMMARS = {
    "arithmetic_ebnf": 'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= [0-9]+ | "(" expr ")"',
    "key_value_ebnf": 'root ::= pair ("," pair){0,2}\npair ::= [a-z]{1,5} "=" [0-9]{1,3}',
    "greeting_lark": 'start: GREETING " " NAME\nGREETING: "hello" | "hi"\nNAME: /[a-z]{2,8}/',
    "list_lark": 'start: "[" item ("," item)* "]"\nitem: /[0-9]{1,2}/',
}

STRUCTURAL_TAGS = {
    "weather_tool": {
        "structures": [{"begin": "<function=get_weather>", "schema": {"type": "object", "properties": {"city": {"enum": ["Paris", "Tokyo"]}}, "required": ["city"]},
                        "end": "</function>"}],
        "triggers": ["<function="],
    },
}
