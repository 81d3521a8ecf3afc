"""Format-style structural tags (xgrammar's ``format`` JSON) written as llguidance Lark."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import llguidance

from ..schema import regex_for_engine
from ..spec import JsonFormat
from .llguidance_schema import Refusal, json_options, llguidance_schema

# ----- format-style structural tags (xgrammar's "format" JSON) as Lark ----------------------------

_TEXT_REGEX = r"/(.|\n)*/"


def format_to_lark(fmt: Any, json_format: JsonFormat | None) -> str:
    """Lark for the subset of xgrammar's structural-tag formats llguidance can express exactly.

    Supported: const_string, json_schema (style "json"), regex, sequence, or, optional, plus,
    star, repeat, tag (string begin/end), any_text as a tag's content, triggered_tags and
    tags_with_separator (without ``excludes``). Token-level formats, dispatch, the XML styles,
    ``excludes`` and any_text limits raise `Refusal` naming the format.
    """
    builder = _LarkBuilder(json_format)
    start = builder.expr(fmt, "format")
    return "%llguidance {}\n" + f"start: {start}\n" + "\n".join(builder.rules) + "\n"


class _LarkBuilder:
    def __init__(self, json_format: JsonFormat | None):
        self.json_format = json_format
        self.rules: list[str] = []
        self.count = 0

    def rule(self, body: str, prefix: str = "r", lazy: bool = False) -> str:
        self.count += 1
        name = f"{prefix}_{self.count}"
        self.rules.append(f"{name}{'[lazy]' if lazy else ''}: {body}")
        return name

    def terminal(self, body: str) -> str:
        self.count += 1
        name = f"TEXT_{self.count}"
        self.rules.append(f"{name}: {body}")
        return name

    def expr(self, fmt: Any, where: str) -> str:
        if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
            raise Refusal(f"a structural-tag format without a type at {where}")
        kind = fmt["type"]
        method = getattr(self, f"_{kind}", None)
        if method is None:
            raise Refusal(f"structural-tag format {kind!r}")
        for option in ("excludes", "exclude_tokens"):
            if fmt.get(option):
                raise Refusal(f"{option!r} in structural-tag format {kind!r}")
        return method(fmt, f"{where}.{kind}")

    def _const_string(self, fmt: dict, where: str) -> str:
        value = fmt.get("value")
        if not isinstance(value, str):
            raise Refusal(f"a const_string without a string value at {where}")
        return _literal(value)

    def _json_schema(self, fmt: dict, where: str) -> str:
        if fmt.get("style", "json") != "json" or fmt.get("any_order"):
            raise Refusal(f"json_schema style {fmt.get('style')!r} / any_order in a structural tag")
        schema = fmt.get("json_schema")
        if schema is True:
            schema = {}
        if not isinstance(schema, dict):
            raise Refusal(f"json_schema {schema!r} in a structural tag")
        prepared = llguidance_schema(schema, self.json_format, f"structural_tag.{where}")
        layout = self.json_format
        assert layout is not None  # llguidance_schema has read it (set for the JSON kinds)
        if fmt.get("max_whitespace_cnt") is not None:
            layout = dataclasses.replace(layout, any_whitespace=True, max_whitespace_cnt=int(fmt["max_whitespace_cnt"]))
        prepared["x-guidance"] = json_options(layout)
        return "%json " + json.dumps(prepared, ensure_ascii=False)

    def _regex(self, fmt: dict, where: str) -> str:
        pattern = fmt.get("pattern")
        if not isinstance(pattern, str):
            raise Refusal(f"a regex without a pattern at {where}")
        return self.terminal("/" + llguidance.regex_to_lark(_tag_regex(pattern), "") + "/")

    def _sequence(self, fmt: dict, where: str) -> str:
        parts = [p for p in (self.expr(e, f"{where}[{i}]") for i, e in enumerate(fmt.get("elements") or [])) if p]
        if not parts:
            raise Refusal(f"an empty sequence at {where}")
        return self.rule(" ".join(parts))

    def _or(self, fmt: dict, where: str) -> str:
        parts = [self.expr(e, f"{where}[{i}]") for i, e in enumerate(fmt.get("elements") or [])]
        if not parts:
            raise Refusal(f"an empty 'or' at {where}")
        return self.rule(" | ".join(parts))

    def _optional(self, fmt: dict, where: str) -> str:
        return self.rule(f"({self.expr(fmt.get('content'), where)})?")

    def _plus(self, fmt: dict, where: str) -> str:
        return self.rule(f"({self.expr(fmt.get('content'), where)})+")

    def _star(self, fmt: dict, where: str) -> str:
        return self.rule(f"({self.expr(fmt.get('content'), where)})*")

    def _repeat(self, fmt: dict, where: str) -> str:
        low, high = fmt.get("min"), fmt.get("max")
        if not isinstance(low, int) or not isinstance(high, int) or low < 0 or (high != -1 and high < low):
            raise Refusal(f"a repeat without valid min/max at {where}")
        inner = self.expr(fmt.get("content"), where)
        return self.rule(f"({inner}){{{low},}}" if high == -1 else f"({inner}){{{low},{high}}}")

    def _tag(self, fmt: dict, where: str, begin_rest: str | None = None) -> str:
        begin, end = fmt.get("begin"), fmt.get("end")
        ends = [end] if isinstance(end, str) else end
        if (
            not isinstance(begin, str)
            or not isinstance(ends, list)
            or not ends
            or not all(isinstance(e, str) for e in ends)
        ):
            raise Refusal(f"a tag with token begin/end at {where}")
        head = _literal(begin if begin_rest is None else begin_rest)  # "" when the trigger is the whole begin
        end_expr = " | ".join(_literal(e) for e in ends if e)
        content = fmt.get("content")
        if isinstance(content, dict) and content.get("type") == "any_text":
            if content.get("max_tokens") is not None or content.get("max_chars") is not None or content.get("excludes"):
                raise Refusal("any_text with limits or excludes in a structural tag")
            if not end_expr:
                raise Refusal(f"any_text in a tag without an end string at {where}")
            # Lazy: the text ends at the first end string, as in xgrammar.
            body = self.rule(f"{_TEXT_REGEX} ({end_expr})", prefix="any_text", lazy=True)
            return self.rule(f"{head} {body}")
        inner = self.expr(content, where)
        return self.rule(f"{head} {inner} {('(' + end_expr + ')') if end_expr else ''}".rstrip())

    def _triggered_tags(self, fmt: dict, where: str) -> str:
        triggers, tags = fmt.get("triggers") or [], fmt.get("tags") or []
        if not tags or not all(isinstance(t, str) and t for t in triggers):
            raise Refusal(f"triggered_tags without triggers or tags at {where}")
        text = self.terminal(_TEXT_REGEX)
        heads: dict[str, str] = {}
        alternatives, direct = [], []
        for index, tag in enumerate(tags):
            begin = tag.get("begin") if isinstance(tag, dict) else None
            trigger = next((t for t in triggers if isinstance(begin, str) and begin.startswith(t)), None)
            if trigger is None:
                raise Refusal(f"a triggered tag whose begin starts with no trigger at {where}[{index}]")
            assert isinstance(begin, str)  # it starts with the trigger found
            if trigger not in heads:
                # Lazy: free text ends at the first occurrence of the trigger, which must open a tag.
                heads[trigger] = self.rule(f"{text} {_literal(trigger)}", prefix="trigger", lazy=True)
            body = self._tag(tag, f"{where}[{index}]", begin_rest=begin[len(trigger) :])
            alternatives.append(f"{heads[trigger]} {body}")
            direct.append(self._tag(tag, f"{where}[{index}]"))
        one = self.rule(" | ".join(alternatives), prefix="tagged")
        if not fmt.get("at_least_one"):
            return self.rule(f"{text} | {one}" if fmt.get("stop_after_first") else f"{one}* {text}")
        # at_least_one (as xgrammar reads it): the output opens with a tag, no text before it.
        first = self.rule(" | ".join(direct), prefix="first")
        return first if fmt.get("stop_after_first") else self.rule(f"{first} {one}* {text}")

    def _tags_with_separator(self, fmt: dict, where: str) -> str:
        tags = fmt.get("tags") or []
        separator = fmt.get("separator")
        if not tags or not isinstance(separator, str):
            raise Refusal(f"tags_with_separator without tags or separator at {where}")
        one = self.rule(" | ".join(self._tag(t, f"{where}[{i}]") for i, t in enumerate(tags)))
        if fmt.get("stop_after_first"):
            return self.rule(one if fmt.get("at_least_one") else f"({one})?")
        repeated = f"{one} ({_literal(separator)} {one})*" if separator else f"({one})+"
        return self.rule(repeated if fmt.get("at_least_one") else f"({repeated})?")


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False) if text else ""


def _tag_regex(pattern: str) -> str:
    """A structural-tag regex as llguidance must see it: Python's exact reading, except that a
    pattern only Rust's syntax reads (Unicode property classes, ``\\p{L}``) is passed through as
    written: its meaning is Rust's, which llguidance enforces exactly."""
    from ..errors import InvalidGrammarError
    from .xgrammar import has_unicode_property_escape

    try:
        return regex_for_engine("llguidance", pattern, part="structural_tag")
    except InvalidGrammarError as error:
        if error.feature and "cannot read" in error.feature and has_unicode_property_escape(pattern):
            return pattern
        raise
