"""Streams of distinct JSON schemas for time-to-ready measurements (`tools/time_to_ready.py`).

generated(n, seed)    seeded, real-looking API / tool-call schemas: nested objects, arrays of
                      objects, $defs and references, enums, bounded and patterned strings,
                      formats, integer and number ranges, nullable anyOf, oneOf of tagged
                      objects; sizes drawn from a heavy tail (most a few properties, some 40-80,
                      now and then a 100-500 entry enum), so the mix has the easy majority and
                      the compile-heavy minority of real traffic. Every schema is distinct (its
                      names carry the index), so every one is a cold compile.
suite()               the JSON-Schema-Test-Suite's draft2020-12 and draft7 schemas, deduplicated
                      (../shared/corpora/json-schema-test-suite; small, keyword-focused).
project()             tests/corpus.py's schemas and tools/load.py's complex schemas.
directory(path)       every *.json file under `path` (e.g. JSONSchemaBench's data/ folders).
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUITE = REPO.parent / "shared" / "corpora" / "json-schema-test-suite" / "tests"

_WORDS = (
    "id name title status kind owner email created updated amount price qty count url path city zip "
    "country note tags items label score level mode region code unit start end active version role"
).split()
_FORMATS = ("date", "date-time", "email", "uuid", "uri", "ipv4", "time")
_PATTERNS = (
    "^[A-Z]{3}-[0-9]{4}$",
    "^[a-z][a-z0-9_]{2,15}$",
    "^[0-9]{5}(-[0-9]{4})?$",
    "^#[0-9a-fA-F]{6}$",
    "^v[0-9]+\\.[0-9]+\\.[0-9]+$",
    "^[A-Z]{2}[0-9]{2}[A-Z0-9]{4,12}$",
    "^\\+?[0-9]{7,14}$",
)


def _size(rng: random.Random) -> int:
    """Property count: log-normal, median ~6, a tail past 40."""
    return max(1, min(80, int(rng.lognormvariate(1.8, 0.8))))


class _Gen:
    def __init__(self, index: int, seed: int):
        self.rng = random.Random(seed * 1_000_003 + index)
        self.index = index
        self.defs: dict[str, dict] = {}

    def name(self, j: int) -> str:
        return f"{self.rng.choice(_WORDS)}_{j}"

    def leaf(self) -> dict:
        rng, roll = self.rng, self.rng.random()
        if roll < 0.25:
            return {"type": "string", "maxLength": rng.choice((8, 16, 32, 64, 120))}
        if roll < 0.35:
            return {"type": "string", "pattern": rng.choice(_PATTERNS)}
        if roll < 0.45:
            return {"type": "string", "format": rng.choice(_FORMATS)}
        if roll < 0.57:
            values = [f"{rng.choice(_WORDS)}{k}" for k in range(rng.choice((3, 4, 6, 10)))]
            return {"enum": values}
        if roll < 0.70:
            low = rng.choice((0, 1, -100))
            return {"type": "integer", "minimum": low, "maximum": low + rng.choice((9, 100, 1000, 65535))}
        if roll < 0.78:
            return {"type": "number", "minimum": 0, "maximum": rng.choice((1, 100, 1e6))}
        if roll < 0.86:
            return {"type": "boolean"}
        if roll < 0.92:
            return {"anyOf": [{"type": "string", "maxLength": 40}, {"type": "null"}]}
        return {"type": "string"}

    def value(self, depth: int) -> dict:
        roll = self.rng.random()
        if depth < 3 and roll < 0.12:
            return self.object(depth + 1, max(1, _size(self.rng) // 2))
        if depth < 3 and roll < 0.20:
            return {
                "type": "array",
                "items": self.object(depth + 1, max(1, _size(self.rng) // 3)),
                "maxItems": self.rng.choice((3, 5, 10)),
            }
        if roll < 0.26:
            return {"type": "array", "items": self.leaf(), "maxItems": self.rng.choice((4, 8))}
        if depth < 2 and roll < 0.31:
            return {"$ref": f"#/$defs/{self.shared(depth)}"}
        if depth < 2 and roll < 0.33:
            return {"oneOf": [self.tagged(tag, depth) for tag in ("a", "b", "c")[: self.rng.choice((2, 3))]]}
        if roll < 0.345:  # a large enum (countries, product codes): heavy for some engines
            return {
                "enum": [f"{self.rng.choice(_WORDS)}_{self.index}_{k}" for k in range(self.rng.choice((100, 250, 500)))]
            }
        return self.leaf()

    def shared(self, depth: int) -> str:
        if self.defs and self.rng.random() < 0.5:
            return self.rng.choice(sorted(self.defs))
        name = f"def{len(self.defs)}_{self.index}"
        self.defs[name] = {}
        self.defs[name] = self.object(depth + 1, max(1, _size(self.rng) // 2))
        return name

    def tagged(self, tag: str, depth: int) -> dict:
        body = self.object(depth + 1, max(1, _size(self.rng) // 3))
        body["properties"] = {"kind": {"const": tag}, **body["properties"]}
        body["required"] = ["kind", *body.get("required", [])]
        return body

    def object(self, depth: int, size: int) -> dict:
        properties = {self.name(j): self.value(depth) for j in range(size)}
        names = list(properties)
        required = [n for n in names if self.rng.random() < 0.6]
        node = {"type": "object", "properties": properties, "required": required}
        if self.rng.random() < 0.7:
            node["additionalProperties"] = False
        return node

    def schema(self) -> dict:
        root = self.object(0, _size(self.rng))
        root["properties"] = {f"request_{self.index}": {"type": "string", "maxLength": 36}, **root["properties"]}
        if self.defs:
            root["$defs"] = self.defs
        return root


def generated(n: int, seed: int = 0) -> list[tuple[str, dict]]:
    """`n` distinct generated schemas (see the module docstring)."""
    return [(f"gen-{seed}-{i}", _Gen(i, seed).schema()) for i in range(n)]


def suite() -> list[tuple[str, dict]]:
    """The JSON-Schema-Test-Suite's schemas (object schemas only, deduplicated, remote refs left out)."""
    seen, out = set(), []
    for draft in ("draft2020-12", "draft7"):
        for path in sorted((SUITE / draft).glob("*.json")):
            for group in json.loads(path.read_text()):
                schema = group["schema"]
                text = json.dumps(schema, sort_keys=True)
                if not isinstance(schema, dict) or text in seen or "http" in text.replace("json-schema.org", ""):
                    continue
                seen.add(text)
                out.append((f"{draft}/{path.stem}/{len(out)}", schema))
    return out


def project() -> list[tuple[str, dict]]:
    """tests/corpus.py's schemas and 32 of tools/load.py's complex schemas."""
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO / "tools"))
    from corpus import SCHEMAS
    from load import complex_schema

    return [(f"corpus/{k}", v) for k, v in SCHEMAS.items()] + [
        (f"load/{i}", complex_schema(10_000 + i)) for i in range(32)
    ]


def directory(path: str) -> list[tuple[str, dict]]:
    out = []
    for file in sorted(Path(path).rglob("*.json")):
        try:
            out.append((os.path.relpath(file, path), json.loads(file.read_text())))
        except (OSError, ValueError):
            continue
    return out


def corpus(name: str, n: int, seed: int) -> list[tuple[str, dict]]:
    """`name`: generated, suite, project, or a directory; at most `n` schemas (seeded shuffle but generated)."""
    if name == "generated":
        return generated(n, seed)
    items = suite() if name == "suite" else project() if name == "project" else directory(name)
    random.Random(seed).shuffle(items)
    return items[:n]
