"""edgerun serve end to end: the official `openai` client and curl against the real server over the default model
(tests/apps/conftest.py: 2 slots, 2 queued per class, 512-token context per slot)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from openai import OpenAI

from tests.apps.conftest import SERVE_CTX
from tests.apps.serve_harness import LiveServer

NO_STORE = {"Cache-Control": "no-store"}  # generate for real, not from the result cache
COUNT = "Count to one thousand: 1, 2, 3, 4, 5,"
ENDLESS = ", ".join(str(i) for i in range(1, 41)) + ","  # greedy, the model counts on for as long as it may


@pytest.fixture(scope="module")
def client(llm_server: LiveServer) -> OpenAI:
    return OpenAI(base_url=llm_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_openai_chat_whole_and_streamed_agree(client: OpenAI) -> None:
    messages = [{"role": "user", "content": "Name three colors."}]
    whole = client.chat.completions.create(model="default", messages=messages, max_tokens=16, temperature=0,
                                           extra_headers=NO_STORE)
    assert whole.object == "chat.completion" and whole.model == "default"
    text = whole.choices[0].message.content
    assert text and whole.choices[0].message.role == "assistant"
    assert whole.usage.completion_tokens <= 16 and whole.usage.prompt_tokens > 5
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens

    stream = client.chat.completions.create(model="default", messages=messages, max_tokens=16, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_headers=NO_STORE)
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces) == text  # greedy: the stream is the same answer, piece by piece
    assert len([p for p in pieces if p]) > 1
    assert finish == whole.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


def test_openai_response_shapes(client: OpenAI) -> None:
    # What OpenAI's own responses carry: one id, created and system_fingerprint (the version that answered) for
    # every chunk of a stream, the role in the first delta, the finish reason in the last choice chunk.
    messages = [{"role": "user", "content": "Hi"}]
    whole = client.chat.completions.create(model="default", messages=messages, max_tokens=3, extra_headers=NO_STORE)
    assert whole.id.startswith("chatcmpl-") and isinstance(whole.created, int) and whole.created > 1.7e9
    assert whole.system_fingerprint and whole.system_fingerprint.startswith("default@")
    assert whole.choices[0].index == 0 and whole.choices[0].logprobs is None
    chunks = list(client.chat.completions.create(model="default", messages=messages, max_tokens=3, stream=True,
                                                 stream_options={"include_usage": True}, extra_headers=NO_STORE))
    assert len({(c.id, c.created, c.system_fingerprint, c.object) for c in chunks}) == 1
    assert chunks[0].system_fingerprint == whole.system_fingerprint and chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3
    assert chunks[-2].choices[0].finish_reason == "length" and all(c.usage is None for c in chunks[:-1])


def test_openai_completions_whole_and_streamed_agree(client: OpenAI) -> None:
    whole = client.completions.create(model="default", prompt=COUNT, max_tokens=12, temperature=0, extra_headers=NO_STORE)
    assert whole.object == "text_completion" and whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 12
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="default", prompt=COUNT, max_tokens=12, temperature=0, stream=True, extra_headers=NO_STORE) if c.choices)
    assert streamed == whole.choices[0].text and "6" in streamed


def test_sampling_fields_reach_the_model(client: OpenAI) -> None:
    def ask(**kw) -> str:
        return client.completions.create(model="default", prompt="Once upon a time", max_tokens=20,
                                         extra_headers=NO_STORE, **kw).choices[0].text

    assert ask(temperature=1.0, top_p=0.9, seed=11) == ask(temperature=1.0, top_p=0.9, seed=11)  # seed repeats
    assert len({ask(temperature=1.5, seed=s) for s in (1, 2, 3)}) > 1  # and different seeds differ
    stopped = client.completions.create(model="default", prompt=COUNT, max_tokens=30, temperature=0, stop=[" 8"],
                                        extra_headers=NO_STORE)
    assert stopped.choices[0].finish_reason == "stop" and " 8" not in stopped.choices[0].text
    assert stopped.choices[0].text.rstrip().endswith("7,")


def test_curl_sse_framing(llm_server: LiveServer) -> None:
    body = json.dumps({"model": "default", "prompt": COUNT, "max_tokens": 8, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    out = subprocess.run(["/usr/bin/curl", "-sS", "-N", "-i", "-H", "Content-Type: application/json", "-H",
                          "Cache-Control: no-store", "-d", body, llm_server.url + "/v1/completions"],
                         capture_output=True, timeout=120, check=True).stdout.decode()
    head, _, stream = out.partition("\r\n\r\n")
    assert "content-type: text/event-stream" in head.lower()
    assert stream.endswith("\n\n") and "\r" not in stream
    events = stream[:-2].split("\n\n")
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


@pytest.mark.slow
def test_too_long_prompt_is_refused_with_count_and_limit_unless_truncate(llm_server: LiveServer) -> None:
    prompt = "word " * (SERVE_CTX * 2)
    status, _, body = llm_server.request("POST", "/v1/completions", {"model": "default", "prompt": prompt, "max_tokens": 4})
    assert status == 400
    message = json.loads(body)["error"]["message"]
    numbers = [int(n) for n in re.findall(r"\d+", message)]
    assert numbers[0] > SERVE_CTX and SERVE_CTX - 4 in numbers and "truncat" in message  # its count, the limit
    status, headers, body = llm_server.request("POST", "/v1/completions", {"model": "default", "prompt": prompt,
                                                                           "max_tokens": 4, "truncate": True}, NO_STORE)
    assert status == 200
    usage = json.loads(body)["usage"]
    dropped = usage["truncated"]["tokens_dropped"]
    assert dropped > SERVE_CTX // 2 and headers["x-edgerun-truncated"] == f"tokens={dropped}, messages=0"


@pytest.mark.slow
@pytest.mark.parametrize("chat", [False, True])
def test_streamed_answer_names_the_truncation_in_its_header(llm_server: LiveServer, chat: bool) -> None:
    # The engine's cut of a prompt that does not fit is known before the stream starts: the header sent with the
    # first event says it, and it agrees with the usage of the final chunk.
    long = "word " * (SERVE_CTX * 2)
    req = {"model": "default", "max_tokens": 4, "truncate": True, "stream": True, "stream_options": {"include_usage": True}}
    req.update({"messages": [{"role": "user", "content": long}]} if chat else {"prompt": long})
    status, headers, body = llm_server.request("POST", "/v1/chat/completions" if chat else "/v1/completions", req,
                                               NO_STORE)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    chunks = [json.loads(e[6:]) for e in body.decode().split("\n\n") if e.startswith("data: {")]
    truncated = chunks[-1]["usage"]["truncated"]
    assert truncated["tokens_dropped"] > SERVE_CTX // 2
    assert headers.get("x-edgerun-truncated") == f"tokens={truncated['tokens_dropped']}, messages={truncated['messages_dropped']}"


@pytest.mark.slow
def test_too_long_conversation_drops_turns_only_when_asked(llm_server: LiveServer) -> None:
    turns = []
    for i in range(12):
        turns += [{"role": "user", "content": f"Tell me fact number {i} about the sea, in detail please."},
                  {"role": "assistant", "content": "The sea is deep and wide and full of life. " * 4}]
    turns.append({"role": "user", "content": "Thanks!"})
    req = {"model": "default", "messages": turns, "max_tokens": 4}
    status, _, body = llm_server.request("POST", "/v1/chat/completions", req)
    assert status == 400 and "conversation is" in json.loads(body)["error"]["message"]
    status, headers, body = llm_server.request("POST", "/v1/chat/completions", {**req, "truncate": True}, NO_STORE)
    assert status == 200
    truncated = json.loads(body)["usage"]["truncated"]
    assert truncated["messages_dropped"] >= 2 and headers["x-edgerun-truncated"].endswith(
        f"messages={truncated['messages_dropped']}")


def test_result_cache_hit_and_no_store(llm_server: LiveServer) -> None:
    req = {"model": "default", "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}
    first = llm_server.request("POST", "/v1/completions", req)
    assert first[0] == 200 and "x-edgerun-cache" not in first[1]
    hits = llm_server.metric("edgerun_cache_hits_total", cache="result")
    t0 = time.perf_counter()
    second = llm_server.request("POST", "/v1/completions", req)
    hit_s = time.perf_counter() - t0
    assert second[1].get("x-edgerun-cache") == "hit" and hit_s < 1.0
    assert json.loads(second[2])["choices"] == json.loads(first[2])["choices"]
    assert llm_server.metric("edgerun_cache_hits_total", cache="result") == hits + 1
    third = llm_server.request("POST", "/v1/completions", req, NO_STORE)
    assert "x-edgerun-cache" not in third[1]
    sampled = {**req, "temperature": 0.9}  # neither greedy nor seeded: never cached
    llm_server.request("POST", "/v1/completions", sampled)
    assert "x-edgerun-cache" not in llm_server.request("POST", "/v1/completions", sampled)[1]


def test_tiny_deadline_is_504(llm_server: LiveServer) -> None:
    req = {"model": "default", "prompt": COUNT, "max_tokens": 200}
    status, _, body = llm_server.request("POST", "/v1/completions", req, {**NO_STORE, "X-Deadline-Ms": "1"})
    assert status == 504 and json.loads(body)["error"]["code"] == "deadline_exceeded"
    status, _, _ = llm_server.request("POST", "/v1/completions", {**req, "deadline_ms": 1}, NO_STORE)
    assert status == 504


def _slots_free(server: LiveServer, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not server.metric("edgerun_slots_busy", model="default"):  # 0, or no request served yet
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("stream", [True, False])
def test_disconnecting_client_frees_its_slot(llm_server: LiveServer, stream: bool) -> None:
    cancelled = llm_server.metric("edgerun_requests_total", model="default", status="cancelled") or 0
    body = json.dumps({"model": "default", "prompt": ENDLESS, "max_tokens": 4000, "temperature": 0, "stream": stream}).encode()
    with socket.create_connection(("127.0.0.1", llm_server.port)) as sock:
        sock.settimeout(60)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Cache-Control: no-store\r\n" + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        if stream:
            got = b""
            while b"data: " not in got:  # the headers and the first event may come in separate reads
                piece = sock.recv(65536)
                assert piece, got  # the server closed the connection before streaming
                got += piece
        else:
            deadline = time.monotonic() + 60
            while llm_server.metric("edgerun_slots_busy", model="default") != 1:  # generating
                assert time.monotonic() < deadline
                time.sleep(0.05)
    # 4000 tokens would take minutes here; the slot is free within a moment of the client leaving.
    assert _slots_free(llm_server, 15.0)
    deadline = time.monotonic() + 15
    while (llm_server.metric("edgerun_requests_total", model="default", status="cancelled") or 0) <= cancelled:
        assert time.monotonic() < deadline, "the request was not counted as cancelled"
        time.sleep(0.05)


@pytest.mark.slow
def test_full_queue_is_429_with_retry_after(llm_server: LiveServer) -> None:
    req = {"model": "default", "prompt": COUNT, "max_tokens": 48}
    assert _slots_free(llm_server, 30)  # 2 slots and 2 queued: of 10 sent at once, some must be refused
    with ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(lambda _: llm_server.request("POST", "/v1/completions", req, NO_STORE), range(10)))
    statuses = sorted(a[0] for a in answers)
    assert set(statuses) == {200, 429} and statuses.count(200) >= 3, statuses
    for status, headers, body in answers:
        if status == 429:
            assert int(headers["retry-after"]) >= 1
            assert json.loads(body)["error"]["code"] == "queue_full"
    assert _slots_free(llm_server, 30)


def test_metrics_show_the_issue_figures(llm_server: LiveServer, client: OpenAI) -> None:
    client.completions.create(model="default", prompt="Hello", max_tokens=4, extra_headers=NO_STORE)
    status, headers, body = llm_server.request("GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    text = body.decode()
    for name in ('edgerun_ttft_seconds_bucket{le="0.005",model="default"', "edgerun_request_seconds_bucket",
                 'edgerun_tokens_total{kind="completion",model="default"}', 'edgerun_tokens_total{kind="prompt"',
                 "edgerun_requests_total", 'edgerun_cache_hits_total{cache="prefix"}', 'edgerun_cache_hits_total{cache="result"}',
                 'edgerun_queue_depth{model="default",priority="interactive"}', 'edgerun_slots_busy{model="default"}',
                 "edgerun_resident_models 1.0", 'edgerun_model_planned_bytes{kind="llm",model="default"',
                 "edgerun_process_rss_bytes", 'edgerun_tokens_per_second{model="default"}',
                 'edgerun_memory_plan_bytes{part="used"}', 'edgerun_memory_plan_bytes{part="budget"}'):
        assert name in text, name
    planned = llm_server.metric("edgerun_model_planned_bytes", kind="llm", model="default")
    assert planned and planned > 50e6  # the 135M model's weights alone are ~90 MB


def test_priority_header_and_body_are_used(llm_server: LiveServer) -> None:
    req = {"model": "default", "prompt": "Hi", "max_tokens": 2}
    assert llm_server.request("POST", "/v1/completions", req, NO_STORE)[1]["x-edgerun-priority"] == "interactive"
    assert llm_server.request("POST", "/v1/completions", {**req, "priority": "batch"}, NO_STORE)[1]["x-edgerun-priority"] == "batch"
    headers = {**NO_STORE, "X-Priority": "urgent"}
    assert llm_server.request("POST", "/v1/completions", req, headers)[1]["x-edgerun-priority"] == "urgent"


def test_one_json_log_line_per_request_without_its_text(llm_server: LiveServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="edgerun.requests")
    secret = "purple-elephant-secret"
    llm_server.request("POST", "/v1/completions", {"model": "default", "prompt": secret, "max_tokens": 2}, NO_STORE)
    llm_server.request("POST", "/v1/completions", {"model": "../x", "prompt": secret})
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "edgerun.requests"]
    assert [(x["model"], x["status"]) for x in lines] == [("default", "ok"), ("", "error")]
    assert lines[0]["completion_tokens"] == 2 and lines[0]["ttft_ms"] > 0 and lines[0]["priority"] == "interactive"
    assert all(secret not in r.getMessage() for r in caplog.records)


def test_urgent_request_is_served_while_batch_streams_fill_every_slot(llm_server: LiveServer) -> None:
    assert _slots_free(llm_server, 30)
    body = json.dumps({"model": "default", "prompt": ENDLESS, "max_tokens": 4000, "temperature": 0, "stream": True,
                       "priority": "batch"}).encode()
    socks = []
    try:
        for _ in range(2):  # both slots: batch streams that would run for minutes
            sock = socket.create_connection(("127.0.0.1", llm_server.port), timeout=60)
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Cache-Control: no-store\r\n" + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            socks.append(sock)
        deadline = time.monotonic() + 60
        while llm_server.metric("edgerun_slots_busy", model="default") != 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        t0 = time.monotonic()
        status, headers, answer = llm_server.request(
            "POST", "/v1/completions", {"model": "default", "prompt": "Hello", "max_tokens": 4}, {**NO_STORE, "X-Priority": "urgent"})
        assert status == 200 and headers["x-edgerun-priority"] == "urgent" and time.monotonic() - t0 < 20
        assert json.loads(answer)["usage"]["completion_tokens"] == 4
    finally:
        for sock in socks:
            sock.close()
    assert _slots_free(llm_server, 15)


SWITCH = {"type": "object", "additionalProperties": False, "required": ["entity", "state"],
          "properties": {"entity": {"enum": ["light.kitchen", "light.hall", "fan.bedroom"]},
                         "state": {"enum": ["on", "off"]}, "brightness": {"type": "integer", "minimum": 0, "maximum": 100}}}


def test_openai_json_schema_answers_validate_whole_and_streamed(client: OpenAI) -> None:
    import jsonschema

    messages = [{"role": "user", "content": "Switch the kitchen light off. Reply in JSON."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "switch", "schema": SWITCH, "strict": True}}
    for seed in range(3):
        whole = client.chat.completions.create(model="default", messages=messages, max_tokens=80, temperature=1.0,
                                               seed=seed, response_format=fmt, extra_headers=NO_STORE)
        assert whole.choices[0].finish_reason == "stop", whole.choices[0].message.content
        jsonschema.validate(json.loads(whole.choices[0].message.content), SWITCH)
    stream = client.chat.completions.create(model="default", messages=messages, max_tokens=80, temperature=0,
                                            response_format=fmt, stream=True, extra_headers=NO_STORE)
    text = "".join(choice.delta.content or "" for chunk in stream for choice in chunk.choices)
    jsonschema.validate(json.loads(text), SWITCH)
    obj = client.chat.completions.create(model="default", messages=messages, max_tokens=24, temperature=0,
                                         response_format={"type": "json_object"}, extra_headers=NO_STORE)
    assert obj.choices[0].message.content.startswith("{")  # an object, valid when whole (tests/runtime/test_grammar.py)


def test_a_schema_or_grammar_that_cannot_be_enforced_is_a_400_naming_it(client: OpenAI) -> None:
    import openai

    messages = [{"role": "user", "content": "Hi"}]
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "^a$"}}}
    with pytest.raises(openai.BadRequestError, match=r"response_format\.json_schema\.schema\.pattern"):
        client.chat.completions.create(model="default", messages=messages, max_tokens=4, response_format=bad)
    with pytest.raises(openai.BadRequestError, match="does not compile as GBNF"):
        client.completions.create(model="default", prompt="Hi", max_tokens=4, extra_body={"grammar": "root ::= nope"})
    done = client.completions.create(model="default", prompt="Is water wet? Answer:", max_tokens=4, temperature=0,
                                     extra_body={"grammar": 'root ::= " yes" | " no"'}, extra_headers=NO_STORE)
    assert done.choices[0].text in (" yes", " no")
