"""runtime.llm.json_schema: a JSON Schema as a grammar that admits only valid instances, or a refusal naming the
schema path of what cannot be enforced. No model: the integer ranges are checked against every number near them by
reading their GBNF as a regular expression (they use only literals, classes, groups, alternation and counts)."""

from __future__ import annotations

import re

import pytest

from runtime.errors import BadInput
from runtime.llm.grammar import MAX_GBNF_BYTES
from runtime.llm.json_schema import MAX_REPEAT, MAX_SCHEMA_DEPTH, _integers, _naturals, schema_grammar


def _regex(gbnf: str) -> re.Pattern[str]:
    """A rule-free GBNF expression of literals ("1"), classes ([0-9]), groups, | and {m}/{m,n} as a regex."""
    out = re.sub(r'"([^"]*)"', lambda m: re.escape(m.group(1)), gbnf)
    return re.compile(out.replace(" ", ""))


@pytest.mark.parametrize("lo, hi", [(0, 0), (0, 9), (0, 150), (7, 13), (10, 99), (99, 1000), (123, 4567), (1, 100_000),
                                    (995, 1005), (-1, 1), (-150, -7), (-13, 250), (-1000, -999)])
def test_an_integer_range_admits_exactly_its_integers(lo: int, hi: int) -> None:
    pattern = _regex(_integers(lo, hi))
    for n in range(lo - 60, hi + 61):
        assert bool(pattern.fullmatch(str(n))) == (lo <= n <= hi), (lo, hi, n)
    for bad in ("-0", "007", "+5", "1.0", ""):
        assert not pattern.fullmatch(bad), bad


def test_a_wide_range_stays_small_and_exact_at_its_ends() -> None:
    text = _naturals(3, 10**15 - 1)
    assert len(text) < 4000
    pattern = _regex(text)
    for n in (0, 1, 2, 3, 4, 10**14, 10**15 - 1):
        assert bool(pattern.fullmatch(str(n))) == (n >= 3), n
    assert not pattern.fullmatch(str(10**15))


def _refusal(schema: object) -> str:
    with pytest.raises(BadInput) as err:
        schema_grammar(schema, "response_format.json_schema.schema")
    return str(err.value)


@pytest.mark.parametrize("schema, words", [
    ({"type": "string", "pattern": "^a$"}, "schema.pattern: is not a keyword this server can enforce"),
    ({"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2}}}, "schema.properties.n.multipleOf: "),
    ({"type": "array", "uniqueItems": True}, "schema.uniqueItems: "),
    ({"not": {"type": "null"}}, "schema.not: "),
    ({"$ref": "https://example.com/s.json"}, "schema.$ref: only local references (#/$defs/NAME) are followed; nothing is fetched"),
    ({"$ref": "#/$defs/missing"}, "schema.$ref: '#/$defs/missing' names nothing in the schema"),
    (False, "schema: is false: no value is valid"),
    ({"type": "array", "maxItems": MAX_REPEAT + 1}, f"schema.maxItems: must be an integer from 0 to {MAX_REPEAT}"),
    ({"type": "string", "minLength": 5, "maxLength": 2}, "schema.maxLength: 2 is under minLength 5"),
    ({"type": "integer", "minimum": 5, "maximum": 2}, "schema: admits no number"),
    ({"type": "integer", "maximum": 1e20}, "schema.maximum: 1e+20 has more than 15 digits"),
    ({"type": "date"}, "schema.type: 'date' is not valid: use one of object, array"),
    ({"type": "string", "format": "email"}, "schema.format: 'email' cannot be enforced (supported: date, time, uuid, date-time)"),
    ({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]},
     "schema.oneOf: is enforced only for alternatives of distinct types"),
    ({"allOf": [{"type": "object"}, {"required": ["a"]}]}, "schema.allOf: is enforced with one schema only"),
    ({"type": "object", "required": ["a"], "additionalProperties": False}, "schema.required: names 'a', which no property allows"),
    ([1, 2], "schema: must be a schema (an object or true), got list"),
])
def test_what_cannot_be_enforced_is_refused_naming_its_path(schema: object, words: str) -> None:
    message = _refusal(schema)
    assert message.startswith("response_format.json_schema.") and words in message and "\n" not in message, message


def test_depth_nodes_and_size_are_bounded() -> None:
    deep: dict = {"type": "string"}
    for _ in range(MAX_SCHEMA_DEPTH + 1):
        deep = {"type": "array", "items": deep}
    assert f"is nested more than {MAX_SCHEMA_DEPTH} levels deep" in _refusal(deep)
    wide = {"type": "object", "properties": {f"p{i}": {"type": "boolean"} for i in range(2001)}}
    assert "has more than 2000 subschemas" in _refusal(wide)
    big = {"type": "object", "properties": {f"p{i}" * 20: {"type": "integer", "minimum": -i, "maximum": 10**12 + i}
                                            for i in range(300)}}
    assert f"at most {MAX_GBNF_BYTES} are accepted" in _refusal(big)


def test_a_self_referring_schema_is_one_recursive_rule() -> None:
    tree = {"$defs": {"node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
            "$ref": "#/$defs/node"}
    text = schema_grammar(tree).text
    assert text.count("ref--defs-node ::=") == 1 and text.count("ref--defs-node") >= 3


def test_annotations_and_what_the_grammar_never_emits_are_accepted() -> None:
    schema = {"title": "t", "description": "d", "type": "object", "additionalProperties": False,
              "properties": {"a": {"type": "string", "default": "x", "examples": ["y"]}}, "$schema": "x", "strict": True}
    assert schema_grammar(schema).text.startswith("root ::= ")


def test_a_required_name_without_a_property_takes_the_additional_properties_schema() -> None:
    text = schema_grammar({"type": "object", "required": ["n"], "additionalProperties": {"type": "integer"}}).text
    assert '"\\"n\\"" ws ":" ws integer' in text
    assert "names 'n', which no property allows" in _refusal({"type": "object", "required": ["n"],
                                                              "unevaluatedProperties": False})
