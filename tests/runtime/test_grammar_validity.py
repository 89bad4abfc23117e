"""Validity at scale: requests per schema family (nested objects, enums, arrays, number ranges, required,
additionalProperties false), each a different prompt and seed, greedy and at temperature 1, on SmolLM2-135M and
Gemma 3 270M, all through an engine's slots at once; every answer ends and validates with ``jsonschema``.

The issue's count is 200 per family, model and temperature: 4,800 requests, about 12 minutes per model on the
2-core CI machine (SmolLM2: 689 s, 0 invalid). The CI tier runs :data:`CI_REQUESTS` per family (the same code, the
same families); ``EDGERUN_VALIDITY_REQUESTS=200`` runs the full count (docs/serving.md has its results)."""

from __future__ import annotations

import json
import os
import random

import jsonschema
import pytest

from runtime.llm.json_schema import schema_grammar

CI_REQUESTS = 16  # one engine batch (16 slots) per family
REQUESTS = int(os.environ.get("EDGERUN_VALIDITY_REQUESTS", CI_REQUESTS))  # per schema family, model and temperature
FAMILIES = {
    "nested": {"type": "object", "required": ["user"], "properties": {"user": {
        "type": "object", "required": ["name", "age"], "properties": {
            "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "home": {"type": "object", "properties": {"room": {"enum": ["kitchen", "hall"]}}}}}}},
    "enums": {"type": "object", "required": ["color", "size"], "properties": {
        "color": {"enum": ["red", "green", "blue"]}, "size": {"enum": ["S", "M", "L", 1, None]},
        "mode": {"const": "auto"}}},
    "arrays": {"type": "array", "minItems": 1, "maxItems": 4, "items": {
        "type": "object", "required": ["id"], "properties": {"id": {"type": "integer", "minimum": -5, "maximum": 5},
                                                          "on": {"type": "boolean"}}}},
    "ranges": {"type": "object", "required": ["t", "p", "q"], "properties": {
        "t": {"type": "number", "minimum": -10.5, "maximum": 40}, "p": {"type": "integer", "exclusiveMinimum": 3,
                                                                          "exclusiveMaximum": 9},
        "q": {"type": "integer", "minimum": 95, "maximum": 1234}}},
    "required": {"type": "object", "required": ["a", "c"], "properties": {
        "a": {"type": "boolean"}, "b": {"type": "string", "maxLength": 8}, "c": {"type": "null"},
        "d": {"type": "array", "items": {"type": "number"}, "maxItems": 3}}},
    "closed": {"type": "object", "additionalProperties": False, "properties": {
        "x": {"type": "integer", "minimum": 0, "maximum": 9}, "y": {"enum": ["u", "v"]},
        "z": {"type": "string", "maxLength": 6}}},
}
WORDS = ("lamp", "door", "fan", "oven", "garden", "window", "heater", "pump", "gate", "radio", "kettle", "blind")


def _prompts(rng: random.Random, n: int) -> list[str]:
    return [f"Record {i}: the {rng.choice(WORDS)} near the {rng.choice(WORDS)} reads {rng.randint(-50, 500)}. "
            f"Describe it as JSON:\n" for i in range(n)]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm", "gemma"])
def test_every_answer_of_every_family_validates(model: str, request: pytest.FixtureRequest) -> None:
    from runtime.serving.engine import Engine
    from runtime.serving.engine_requests import GenRequest

    rng = random.Random(model)
    with Engine.load(request.getfixturevalue(model), memory=1 << 30, slots=16, ctx=256, threads=2,
                     max_queued=REQUESTS * len(FAMILIES)) as engine:
        for temperature in (0.0, 1.0):
            jobs = []
            for family, schema in FAMILIES.items():
                grammar = schema_grammar(schema, family)
                for i, prompt in enumerate(_prompts(rng, REQUESTS)):
                    # every family's answers are bounded by its schema, well within 120 tokens: each one ends
                    params = engine.params(grammar=grammar, max_tokens=120, temperature=temperature, seed=i)
                    jobs.append((family, engine.submit(GenRequest(engine.tokenize(prompt), params))))
            invalid = []
            for family, handle in jobs:
                result = handle.result(timeout=900)
                try:
                    assert result.stop_reason == "eos"
                    jsonschema.validate(json.loads(result.text), FAMILIES[family])
                except (AssertionError, ValueError, jsonschema.ValidationError):
                    invalid.append((family, result.stop_reason, result.text))
            assert not invalid, (temperature, len(invalid), invalid[:3])
