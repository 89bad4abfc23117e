"""``edgerun loadtest`` against a real Starlette/uvicorn server on loopback: an OpenAI-shaped stub written here,
whose timing and answers are known, so what the load test measures and counts can be checked exactly.

The stub serves at most ``slots`` streams at once (an asyncio.Semaphore), waits ``ttft_s`` before the first chunk,
then sends ``max_tokens`` one-token chunks ``token_s`` apart, a usage chunk and ``data: [DONE]``. A prompt names a
misbehaviour: ``reject`` (429 + Retry-After), ``gateway`` (504), ``deadline`` (an error event mid-stream),
``broken`` (the stream ends without [DONE]), ``redirect`` (307 elsewhere).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, StreamingResponse
from starlette.routing import Route

from apps.cli import main as cli
from apps.loadtest import LoadSpec, loopback_base, run_load
from apps.loadtest.workload import Prompt
from runtime.errors import BadInput


@dataclass
class Stub:
    slots: int = 8
    ttft_s: float = 0.0
    token_s: float = 0.0
    seen: list[dict] = field(default_factory=list)  # per request: headers and body
    hung_up: int = 0  # streams the client left before the end
    landed: int = 0  # requests that followed a redirect
    hung_up_early: int = 0  # of those, before the first chunk
    sem: asyncio.Semaphore | None = None
    port: int = 0

    def reset(self, slots: int = 8, ttft_s: float = 0.0, token_s: float = 0.0) -> None:
        self.slots, self.ttft_s, self.token_s = slots, ttft_s, token_s
        self.seen.clear()
        self.hung_up = self.landed = self.hung_up_early = 0
        self.sem = None  # made on the server's loop at the next request

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _app(stub: Stub) -> Starlette:
    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [{"id": "stub-model", "object": "model"}]})

    async def complete(request: Request):
        body = await request.json()
        stub.seen.append({"headers": dict(request.headers), "body": body})
        text = body["messages"][-1]["content"] if "messages" in body else body["prompt"]
        chat = "messages" in body
        if "reject" in text:
            return JSONResponse({"error": {"message": "queue full", "type": "rate_limit", "param": None, "code": "queue_full"}},
                                status_code=429, headers={"Retry-After": "0.05"})
        if "gateway" in text:
            return JSONResponse({"error": {"message": "deadline passed", "type": "timeout", "param": None, "code": "timeout"}},
                                status_code=504)
        if "redirect" in text:
            return RedirectResponse(f"http://127.0.0.1:{stub.port}/landed", status_code=307)
        if stub.sem is None:
            stub.sem = asyncio.Semaphore(stub.slots)

        def chunk(piece: str) -> str:
            choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
            return "data: " + json.dumps({"object": "chunk", "choices": [choice]}) + "\n\n"

        async def events():
            finished = sent = False
            async with stub.sem:
                try:
                    await asyncio.sleep(stub.ttft_s)
                    for i in range(body["max_tokens"]):
                        if i:
                            await asyncio.sleep(stub.token_s)
                        yield chunk(f" t{i}")
                        sent = True
                        if "deadline" in text and i == 1:
                            yield "data: " + json.dumps({"error": {"message": "deadline passed", "type": "timeout",
                                                                   "code": "deadline_exceeded"}}) + "\n\n"
                            finished = True
                            return
                    usage = {"prompt_tokens": 5, "completion_tokens": body["max_tokens"],
                             "total_tokens": 5 + body["max_tokens"]}
                    yield "data: " + json.dumps({"object": "chunk", "choices": [], "usage": usage}) + "\n\n"
                    if "broken" not in text:
                        yield "data: [DONE]\n\n"
                    finished = True
                finally:
                    if not finished:
                        stub.hung_up += 1
                        stub.hung_up_early += not sent

        return StreamingResponse(events(), media_type="text/event-stream")

    async def landed(request: Request):  # where a redirect points: reaching it means the redirect was followed
        stub.landed += 1
        return JSONResponse({"error": {"message": "followed a redirect"}}, status_code=500)

    return Starlette(routes=[Route("/landed", landed, methods=["GET", "POST"]), Route("/v1/models", models),
                             Route("/v1/chat/completions", complete, methods=["POST"]),
                             Route("/v1/completions", complete, methods=["POST"])])


@pytest.fixture(scope="module")
def stub():
    state = Stub()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    state.port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(_app(state), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    yield state
    server.should_exit = True
    thread.join(10)
    sock.close()


@pytest.fixture
def fresh(stub: Stub) -> Stub:
    stub.reset()
    return stub


def _one_line_refusal(capsys, argv: list[str], *fragments: str) -> str:
    code = cli(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    return err


# --- where it may send requests ----------------------------------------------------------------------------------

@pytest.mark.parametrize("url, fragment", [
    ("http://10.0.0.1:8080", "'10.0.0.1' is not loopback"),
    ("http://0.0.0.0:8080", "'0.0.0.0' is not loopback"),  # binds everywhere, but as a destination it is not this machine
    ("http://example.com:8080", "'example.com' is not loopback"),
    ("http://127.0.0.1.nip.io:8080", "is not loopback"),  # a name that only looks like loopback
    ("http://[2001:db8::1]:8080", "is not loopback"),
    ("ftp://127.0.0.1:8080", "is not http(s)"),
    ("127.0.0.1:8080", "is not http(s)"),
    ("http://user:pw@127.0.0.1:8080", "carries credentials"),
    ("http://127.0.0.1:8080/admin", "has the path"),
    ("http://127.0.0.1:99999", "is not valid"),
])
def test_a_url_off_this_machine_is_refused_in_one_line(capsys, fresh: Stub, url: str, fragment: str) -> None:
    _one_line_refusal(capsys, ["loadtest", url, "--duration", "1"], fragment)


def test_the_refusal_comes_before_any_request(fresh: Stub) -> None:
    # the stub is on 127.0.0.1; the same port on a non-loopback name is refused before a connection is tried
    with pytest.raises(BadInput):
        loopback_base(f"http://{socket.gethostname()}.invalid:{fresh.port}")
    assert fresh.seen == []


@pytest.mark.parametrize("url, base", [
    ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
    ("http://127.1.2.3:8080/v1/", "http://127.1.2.3:8080"),  # all of 127.0.0.0/8 is loopback
    ("http://[::1]:8080", "http://[::1]:8080"),
    ("http://localhost:8080", "http://localhost:8080"),
    ("https://127.0.0.1", "https://127.0.0.1:443"),
])
def test_loopback_urls_are_accepted(url: str, base: str) -> None:
    assert loopback_base(url) == base


# --- flag values -------------------------------------------------------------------------------------------------

def test_bad_flag_values_are_refused_in_one_line(capsys, tmp_path: Path, fresh: Stub) -> None:
    url = fresh.url
    for flags, fragment in [
        (["--concurrency", "0"], "--concurrency"),
        (["--concurrency", "1025"], "use an integer from 1 to 1024"),
        (["--concurrency", "2.5"], "is not an integer"),
        (["--duration", "0"], "--duration"),
        (["--duration", "nan"], "is out of range"),
        (["--duration", "1e9"], "is out of range"),
        (["--timeout", "inf"], "--timeout"),
        (["--max-tokens", "0"], "--max-tokens"),
        (["--max-requests", "0"], "--max-requests"),
        (["--deadline-ms", "0"], "--deadline-ms"),
        (["--target-ttft-p95", "0"], "--target-ttft-p95"),
        (["--temperature", "-1"], "--temperature"),
        (["--api", "embeddings"], "invalid choice"),
        (["--priority-mix", "urgent=x"], "'x' is not a number"),
        (["--priority-mix", "realtime=1"], "one of urgent, interactive, batch"),
        (["--priority-mix", "urgent=0,batch=0"], "sum to 0"),
        (["--priority-mix", "urgent=1,urgent=2"], "urgent is given twice"),
        (["--priority-mix", "urgent=inf"], "is out of range"),
        (["--prompts", str(tmp_path / "absent.txt")], "cannot read it"),
    ]:
        _one_line_refusal(capsys, ["loadtest", url, "--duration", "1", *flags] if "--duration" not in flags
                          else ["loadtest", url, *flags], fragment)
    assert fresh.seen == []  # every refusal came before a request


def test_bad_prompt_and_key_files_are_refused_in_one_line(capsys, tmp_path: Path, fresh: Stub) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('hello\n{"prompt": 3}\n')
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "x"\n')
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9\n".encode("latin-1"))
    two_keys = tmp_path / "key"
    two_keys.write_text("one two\n")
    for flags, fragment in [
        (["--prompts", str(empty)], "no prompts in it"),
        (["--prompts", str(bad_json)], "line 2: a JSON line must be an object"),
        (["--prompts", str(broken)], "line 1: not valid JSON"),
        (["--prompts", str(latin1)], "not UTF-8"),
        (["--api-key-file", str(two_keys)], "not one key"),
    ]:
        _one_line_refusal(capsys, ["loadtest", fresh.url, "--duration", "1", *flags], fragment)
    assert fresh.seen == []


# --- what it measures and counts ---------------------------------------------------------------------------------

def test_latency_and_tokens_are_measured_against_a_known_server(fresh: Stub) -> None:
    fresh.reset(slots=8, ttft_s=0.2, token_s=0.01)
    report = run_load(LoadSpec(base=fresh.url, concurrency=2, duration_s=30, max_tokens=12, max_requests=6))
    assert report.requests == 6 and report.counts["ok"] == 6, report
    assert report.model == "stub-model"  # the first of GET /v1/models
    assert report.tokens == 6 * 12  # usage.completion_tokens
    assert 200 <= report.ttft_ms["p50"] < 200 + 150, report.ttft_ms  # the stub's 0.2 s before the first chunk
    # the end-to-end time holds the first token and 11 more 10 ms apart
    assert report.e2e_ms["p50"] >= report.ttft_ms["p50"] + 11 * 10
    assert report.tokens_per_s == pytest.approx(report.tokens / report.wall_s)
    assert report.stream_decode_tps_p50 is not None and report.stream_decode_tps_p50 <= 100  # at most 1 per 10 ms


def test_each_outcome_is_counted(tmp_path: Path, capsys, fresh: Stub) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("fine\nreject me\ngateway please\ndeadline soon\nbroken stream\n")
    code = cli(["loadtest", fresh.url, "--concurrency", "2", "--duration", "30", "--max-requests", "10",
                "--prompts", str(prompts), "--max-tokens", "4", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    # requests go round the prompts: two of each
    assert out["requests"] == 10
    assert out["counts"] == {"ok": 2, "rejected": 2, "timeout": 4, "disconnected": 0, "error": 2}, out
    assert out["errors"] == {"the stream ended without data: [DONE]": 2}


def test_a_redirect_is_not_followed(tmp_path: Path, fresh: Stub) -> None:
    report = run_load(LoadSpec(base=fresh.url, concurrency=1, duration_s=30, max_requests=1,
                               prompts=(Prompt(text="redirect me"),)))
    assert report.counts["error"] == 1 and len(fresh.seen) == 1
    assert fresh.landed == 0  # a redirect could point off this machine


def test_proxy_settings_are_ignored(monkeypatch, fresh: Stub) -> None:
    # a proxy from the environment would carry the load off this machine (or nowhere)
    for var in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(var, "http://10.255.255.1:9")
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    report = run_load(LoadSpec(base=fresh.url, concurrency=1, duration_s=30, max_tokens=2, max_requests=2,
                               request_timeout_s=5))
    assert report.counts["ok"] == 2, report.errors


def test_headers_priority_mix_cache_and_key(tmp_path: Path, capsys, fresh: Stub) -> None:
    key = tmp_path / "key"
    key.write_text("sk-local-123\n")
    code = cli(["loadtest", fresh.url + "/v1", "--concurrency", "4", "--duration", "30", "--max-requests", "200",
                "--max-tokens", "1", "--priority-mix", "urgent=0.25,batch=0.75", "--api-key-file", str(key),
                "--deadline-ms", "2500", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["counts"]["ok"] == 200
    headers = [s["headers"] for s in fresh.seen]
    assert all(h["authorization"] == "Bearer sk-local-123" for h in headers)
    assert all(h["cache-control"] == "no-store" for h in headers)  # serving is measured, not the result cache
    assert all(h["x-deadline-ms"] == "2500" for h in headers)
    urgent = sum(h["x-priority"] == "urgent" for h in headers)
    assert {h["x-priority"] for h in headers} == {"urgent", "batch"}
    assert 25 <= urgent <= 80, urgent  # 50 expected; seeded, so this is fixed, but any seed stays in this band
    assert set(out["by_priority"]) == {"urgent", "batch"}
    body = fresh.seen[0]["body"]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True} and body["temperature"] == 0.0

    fresh.reset()
    assert cli(["loadtest", fresh.url, "--duration", "30", "--max-requests", "1", "--max-tokens", "1", "--use-cache",
                "--api", "completions", "--json"]) == 0
    capsys.readouterr()
    seen = fresh.seen[0]
    assert "cache-control" not in seen["headers"] and "x-deadline-ms" not in seen["headers"] and "prompt" in seen["body"]


def test_loops_are_bounded_in_time(fresh: Stub) -> None:
    fresh.reset(ttft_s=0.0, token_s=0.0)
    start = time.monotonic()
    report = run_load(LoadSpec(base=fresh.url, concurrency=3, duration_s=1.0, max_tokens=1))
    took = time.monotonic() - start
    assert 1.0 <= took < 3.0, took
    assert report.requests > 3 and report.counts["ok"] == report.requests


def test_a_refusing_server_is_not_spun_on(tmp_path: Path, fresh: Stub) -> None:
    # every answer is a 429 with Retry-After 0.05 s: one client pauses that long after each
    report = run_load(LoadSpec(base=fresh.url, concurrency=1, duration_s=1.0, prompts=(Prompt(text="reject"),)))
    assert report.counts["rejected"] == report.requests
    assert report.requests <= 1.0 / 0.05 + 1


def test_clients_that_hang_up_are_counted_and_the_server_sees_it(fresh: Stub) -> None:
    # a stream lasts 1 + 39 x 0.05 s: every hang-up (after 1-8 chunks, or after 0.1-1 s) comes before its end,
    # and one after 0.1-1 s comes before the first chunk (a client that leaves while its request waits)
    fresh.reset(ttft_s=1.0, token_s=0.05)
    report = run_load(LoadSpec(base=fresh.url, concurrency=4, duration_s=30, max_tokens=40, max_requests=12,
                               disconnect_fraction=1.0))
    assert report.counts["disconnected"] == 12, report.counts
    deadline = time.monotonic() + 5
    while fresh.hung_up < 12 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fresh.hung_up == 12
    assert 0 < fresh.hung_up_early < 12, fresh.hung_up_early  # both kinds: before the first chunk, and mid-stream


def test_capacity_search_finds_the_highest_concurrency_meeting_the_target(capsys, fresh: Stub) -> None:
    # 2 slots; 0.15 s to the first token, 10 tokens 0.03 s apart: a request holds a slot ~0.45 s. Up to 2 clients the
    # TTFT is ~0.15 s; a third waits for a slot (TTFT ~0.45-0.6 s), so a 0.4 s target is met at 2 and missed at 3.
    fresh.reset(slots=2, ttft_s=0.15, token_s=0.03)
    code = cli(["loadtest", fresh.url, "--concurrency", "8", "--duration", "1.5", "--max-tokens", "10",
                "--target-ttft-p95", "0.4", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["best"] == 2, out["steps"]
    assert [s["concurrency"] for s in out["steps"]] == [1, 2, 4, 3]  # doubling, then bisecting
    assert len(out["steps"]) <= 12


def test_capacity_search_exits_1_when_even_one_client_misses(capsys, fresh: Stub) -> None:
    fresh.reset(slots=2, ttft_s=0.2)
    code = cli(["loadtest", fresh.url, "--concurrency", "4", "--duration", "0.5", "--max-tokens", "1",
                "--target-ttft-p95", "0.05"])
    out = capsys.readouterr().out
    assert code == 1
    assert "capacity for TTFT p95 <= 0.05 s with every request answered: none" in out
