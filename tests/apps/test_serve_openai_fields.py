"""OpenAI request fields as real clients send them: accepted when they change nothing here, refused with one line
naming the field when this server cannot honour them, never silently dropped. No server, no model."""

from __future__ import annotations

import json

import pytest

from apps.server import openai_api as api
from runtime.errors import BadInput, QueueFull

CAP = 1000


def _chat(**extra: object) -> api.GenArgs:
    return api.parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}, CAP)


@pytest.mark.parametrize("extra", [
    {"n": None}, {"n": 1}, {"best_of": None}, {"echo": False}, {"logprobs": False}, {"logprobs": None},
    {"top_logprobs": 0}, {"tools": []}, {"tools": None}, {"logit_bias": {}}, {"logit_bias": None},
    {"logprobs": True, "top_logprobs": 20}, {"logit_bias": {"50": -100, "7": 2.5}}, {"tool_choice": "none"},
    {"response_format": {"type": "text"}}, {"user": "u-1"}, {"metadata": {"a": "b"}}, {"store": False},
    {"unknown_field": 1},
])
def test_fields_that_change_nothing_are_accepted(extra: dict) -> None:
    _chat(**extra)


@pytest.mark.parametrize("extra", [
    {"n": 2}, {"n": True}, {"n": 1.0}, {"best_of": 3}, {"echo": True}, {"functions": [{"name": "f"}]},
])
def test_fields_this_server_cannot_honour_are_refused_by_name(extra: dict) -> None:
    (name,) = extra
    with pytest.raises(BadInput, match=f"^{name}: "):
        _chat(**extra)


@pytest.mark.parametrize("extra, match", [
    ({"logprobs": 1}, "^logprobs must be true or false"), ({"top_logprobs": 3}, "^top_logprobs needs logprobs: true"),
    ({"logprobs": True, "top_logprobs": 21}, "^top_logprobs must be an integer from 0 to 20"),
    ({"logit_bias": {"x": 1}}, "^logit_bias 'x'"), ({"logit_bias": {"5": 101}}, "^logit_bias '5'"),
    ({"logit_bias": {"5": True}}, "^logit_bias '5'"), ({"logit_bias": [1]}, "^logit_bias must be an object"),
])
def test_bad_logprobs_and_logit_bias_are_refused_in_one_line(extra: dict, match: str) -> None:
    with pytest.raises(BadInput, match=match):
        _chat(**extra)


def test_logprobs_and_logit_bias_reach_the_sampling_settings() -> None:
    assert _chat(logprobs=True).sampling["top_logprobs"] == 0
    assert _chat(logprobs=True, top_logprobs=5).sampling["top_logprobs"] == 5
    assert "top_logprobs" not in _chat(logprobs=False).sampling
    assert _chat(logit_bias={"9": 1, "3": -100}).sampling["logit_bias"] == ((3, -100.0), (9, 1.0))
    done = api.parse_completion({"model": "m", "prompt": "x", "logprobs": 2}, CAP)
    assert done.sampling["top_logprobs"] == 2
    with pytest.raises(BadInput, match="^logprobs must be an integer from 0 to 5"):
        api.parse_completion({"model": "m", "prompt": "x", "logprobs": 6}, CAP)


def test_max_completion_tokens_is_max_tokens_and_errors_name_it() -> None:
    assert _chat(max_completion_tokens=7).sampling["max_tokens"] == 7
    assert _chat(max_tokens=5, max_completion_tokens=7).sampling["max_tokens"] == 7
    with pytest.raises(BadInput, match=f"^max_completion_tokens {CAP + 1} is over this server's limit of {CAP}"):
        _chat(max_completion_tokens=CAP + 1)
    with pytest.raises(BadInput, match="^max_completion_tokens must be"):
        _chat(max_completion_tokens="10")


def test_stop_as_a_string_or_a_list_and_its_bounds() -> None:
    assert _chat(stop="\n").sampling["stop"] == ("\n",)
    assert _chat(stop=["a", "b"]).sampling["stop"] == ("a", "b")
    for bad in (["x"] * 17, ["x" * 257], [""], [1]):
        with pytest.raises(BadInput, match="^stop"):
            _chat(stop=bad)


@pytest.mark.parametrize("retry_after, header", [(0.0001, "1"), (1.0, "1"), (1.001, "2"), (2.5, "3")])
def test_retry_after_is_whole_seconds_rounded_up(retry_after: float, header: str) -> None:
    response = api.error_response(QueueFull("the interactive queue is full", retry_after))
    assert response.status_code == 429 and response.headers["retry-after"] == header
    assert json.loads(response.body)["error"]["code"] == "queue_full"


def test_a_long_bad_value_is_shown_short_and_the_error_still_says_what_is_valid() -> None:
    from starlette.requests import Request

    from apps.server.classify import body_kind
    from apps.server.request import priority_of

    def request(headers: dict[str, str]) -> Request:
        raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        return Request({"type": "http", "method": "POST", "path": "/", "headers": raw, "query_string": b""})

    long = "x" * 5000
    for req, body, where in ((request({"X-Priority": long}), None, "X-Priority"), (request({}), long, "priority")):
        response = api.error_response(pytest.raises(BadInput, priority_of, req, body, None).value)
        message = json.loads(response.body)["error"]["message"]
        assert message.startswith(where) and message.endswith("urgent, interactive, batch") and len(message) < 200
    with pytest.raises(BadInput) as err:
        body_kind("text/" + long)
    assert "image/png" in api.error_body(err.value)["error"]["message"]


def test_response_formats_become_the_answers_grammar() -> None:
    from runtime.llm.grammar import JSON_OBJECT

    assert "grammar" not in _chat(response_format={"type": "text"}).sampling
    assert _chat(response_format={"type": "json_object"}).sampling["grammar"] is JSON_OBJECT
    schema = {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}
    grammar = _chat(response_format={"type": "json_schema", "json_schema": {"name": "switch", "schema": schema,
                                                                            "strict": True}}).sampling["grammar"]
    assert grammar.text.startswith("root ::= ") and '"\\"on\\""' in grammar.text
    assert _chat(grammar='root ::= "yes" | "no"').sampling["grammar"].text == 'root ::= "yes" | "no"'


@pytest.mark.parametrize("extra, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {}}}, "^response_format.json_schema must be an object"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}}, "name must be"),
    ({"response_format": {"type": "xml"}}, "^response_format.type 'xml' is not valid: use text, json_object or json_schema"),
    ({"response_format": "json"}, "^response_format must be an object"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {
        "type": "object", "properties": {"x": {"type": "string", "pattern": "^a+$"}}}}}},
     r"^response_format.json_schema.schema.properties.x.pattern: is not a keyword this server can enforce"),
    ({"grammar": 5}, "^grammar must be GBNF text"),
    ({"grammar": "x" * 70_000}, "^grammar is 70000 bytes; at most 65536"),
    ({"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, "give one of them"),
])
def test_a_bad_format_or_grammar_is_refused_naming_its_field(extra: dict, words: str) -> None:
    with pytest.raises(BadInput, match=words):
        _chat(**extra)
