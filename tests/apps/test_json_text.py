"""A JSON body is text: a lone surrogate (``"\\ud800"``, valid JSON but half of a character) is one 400 line naming
the field, where it used to reach the tokenizer or the log's encoder and end the request in a 500."""

from __future__ import annotations

import pytest

from apps.server.openai_api import parse_chat, parse_json
from runtime.errors import BadInput


@pytest.mark.parametrize("body, where", [
    (rb'{"messages": [{"role": "user", "content": "hi \ud800"}]}', "messages[0].content"),
    (rb'{"messages": [{"role": "user", "content": "hi"}], "stop": ["\udfff"]}', "stop[0]"),
    (rb'{"messages": [{"role": "user", "content": "hi"}], "user": "\ud83d"}', "user"),
    (rb'{"messages": [{"role": "user", "content": "hi"}], "\ud800": 1}', "\\ud800"),
])
def test_a_lone_surrogate_is_one_line_naming_its_field(body: bytes, where: str) -> None:
    with pytest.raises(BadInput, match="lone surrogate") as err:
        parse_json(body)
    message = str(err.value)
    assert where in message and "\n" not in message
    message.encode("utf-8")  # the refusal itself is text


def test_a_whole_surrogate_pair_is_text() -> None:
    data = parse_json(rb'{"model": "m", "messages": [{"role": "user", "content": "a smile \ud83d\ude00"}]}')
    assert parse_chat(data, 64).messages[0]["content"] == "a smile \U0001f600"
