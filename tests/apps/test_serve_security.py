"""edgerun serve is closed by default: loopback only without a key, keys compared in full, a body cap, model names
that never reach the filesystem, CORS off unless configured. A real uvicorn server; no model is loaded (every case
here is refused before a model would be touched)."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.cli import main as edgerun
from apps.server.config import Limits, ModelEntry, ServeConfig, load_config
from apps.server.security import check_bind, is_loopback, load_keys
from runtime.errors import BadInput
from runtime.serving.scheduler import Priority
from tests.apps.serve_harness import LiveServer

KEY = "sk-test-0123456789abcdef"
BATCH_KEY = "sk-batch-0123456789abcdef"
CAP = 4096


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder = tmp_path_factory.mktemp("keys")
    keys = folder / "keys.txt"
    keys.write_text(f"# comment\n{KEY} urgent admin\n{BATCH_KEY} batch\n")
    cfg = ServeConfig(api_keys_file=keys, models=[ModelEntry("default", "default")], limits=Limits(max_body_bytes=CAP))
    server = LiveServer(cfg, load=False)
    server.state.ready.set()  # no model: every request below is answered before one would be needed
    yield server
    server.stop()


def _chat(model: object = "default") -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}]}


def test_non_loopback_bind_without_key_is_refused_before_binding(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as probe:  # a free port: after the refusal nothing may be listening on it
        probe.bind(("0.0.0.0", 0))
        port = probe.getsockname()[1]
    assert edgerun(["serve", "--host", "0.0.0.0", "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "without an API key" in err and "--api-key-file" in err
    with socket.socket() as again:
        again.bind(("0.0.0.0", port))  # still free: the refusal came before any bind


def test_bind_rules() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("127.8.9.1")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("192.168.1.20")
    check_bind("127.0.0.1", load_keys(None))  # loopback without a key: fine
    with pytest.raises(BadInput):
        check_bind("::", load_keys(None))


@pytest.mark.parametrize("addresses, loopback", [
    (["127.0.0.1", "::1"], True), (["127.0.1.1"], True), (["127.0.0.1", "192.168.1.20"], False), (["10.0.0.5"], False),
    (["fe80::1%eth0"], False), ([], False), (None, False),  # None: the name does not resolve
])
def test_a_host_name_is_loopback_only_when_every_address_it_resolves_to_is(monkeypatch: pytest.MonkeyPatch,
                                                                            addresses: list[str] | None, loopback: bool) -> None:
    def resolve(host: str, *args: object, **kwargs: object) -> list:
        if addresses is None:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0)) for a in addresses]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    assert is_loopback("box.example") is loopback
    if not loopback:
        with pytest.raises(BadInput, match="without an API key"):
            check_bind("box.example", load_keys(None))


def test_keys_file_rules(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"{KEY}\n{BATCH_KEY} batch admin\n")
    keys = load_keys(path)
    assert keys.check(KEY).max_priority is Priority.INTERACTIVE and not keys.check(KEY).admin
    assert keys.check(BATCH_KEY).max_priority is Priority.BATCH and keys.check(BATCH_KEY).admin
    assert keys.check(KEY[:-1]) is None and keys.check(KEY + "x") is None and keys.check("") is None
    for text, why in [("short urgent\n", "at least 16"), (f"{KEY} superuser\n", "valid: urgent"), ("# only\n", "no API keys"),
                      (f"{KEY} urgent batch\n", "expected 'KEY")]:
        path.write_text(text)
        with pytest.raises(BadInput, match=why):
            load_keys(path)


@pytest.mark.parametrize("auth", [None, "Bearer wrong-key-0123456789", f"Basic {KEY}", f"Bearer {KEY}x"])
def test_wrong_or_missing_key_is_401(keyed: LiveServer, auth: str | None) -> None:
    status, headers, body = keyed.request("POST", "/v1/chat/completions", _chat(), {"Authorization": auth} if auth else {})
    assert status == 401 and headers["www-authenticate"] == "Bearer"
    assert json.loads(body)["error"]["type"] == "authentication_error"
    status, _, _ = keyed.request("GET", "/metrics", headers={"Authorization": auth} if auth else {})
    assert status == 401


def test_openai_client_retrieves_a_model_and_an_unknown_one_is_404(keyed: LiveServer) -> None:
    import openai

    client = openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEY, max_retries=0)
    model = client.models.retrieve("default")
    assert (model.id, model.object, model.owned_by) == ("default", "model", "edgerun")
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("nope")
    assert err.value.body["code"] == "model_not_found"
    status, _, body = keyed.request("GET", "/v1/models/a%5Cb", headers={"Authorization": f"Bearer {KEY}"})
    assert status == 400 and "model name" in json.loads(body)["error"]["message"]


def test_health_needs_no_key_and_the_right_key_passes(keyed: LiveServer) -> None:
    assert keyed.request("GET", "/healthz")[0] == 200
    status, _, body = keyed.request("GET", "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == ["default"]


@pytest.mark.parametrize("model", ["../../etc/passwd", "/etc/passwd", "models/x", "..", "a\\b", "x" * 65, "", 7, None])
def test_path_like_model_name_is_400_before_any_lookup(keyed: LiveServer, model: object) -> None:
    status, _, body = keyed.request("POST", "/v1/chat/completions", _chat(model), {"Authorization": f"Bearer {KEY}"})
    assert status == 400, body
    assert json.loads(body)["error"]["param"] == "model"


def test_unknown_model_is_404(keyed: LiveServer) -> None:
    status, _, body = keyed.request("POST", "/v1/completions", {"model": "nope", "prompt": "x"},
                                    {"Authorization": f"Bearer {KEY}"})
    assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"
    assert "default" in json.loads(body)["error"]["message"]


def test_oversized_body_is_413_declared_or_chunked(keyed: LiveServer) -> None:
    big = json.dumps({**_chat(), "pad": "x" * (CAP + 1)}).encode()
    status, _, body = keyed.request("POST", "/v1/chat/completions", big, {"Authorization": f"Bearer {KEY}"})
    assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
    # Chunked: no Content-Length to trust; refused once the chunks received pass the cap.
    conn = http.client.HTTPConnection("127.0.0.1", keyed.port, timeout=30)
    chunks = (big[i : i + 1000] for i in range(0, len(big), 1000))
    conn.request("POST", "/v1/chat/completions", body=chunks, encode_chunked=True,
                 headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 413
    conn.close()


def test_bad_json_and_bad_fields_are_400_naming_the_field(keyed: LiveServer) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    assert keyed.request("POST", "/v1/chat/completions", b"{not json", auth)[0] == 400
    for extra, word in [({"max_tokens": 0}, "max_tokens"), ({"temperature": "hot"}, "temperature"), ({"n": 2}, "n:"),
                        ({"top_p": 1.5}, "top_p"), ({"stop": [""]}, "stop"), ({"priority": "vip"}, "priority"),
                        ({"deadline_ms": -5}, "deadline_ms"), ({"stream": "yes"}, "stream")]:
        status, _, body = keyed.request("POST", "/v1/chat/completions", {**_chat(), **extra}, auth)
        assert status == 400 and word in json.loads(body)["error"]["message"], (extra, body)


@pytest.mark.parametrize("body", [b"[" * 100_000, b'{"model": "default", "seed": ' + b"9" * 5000 + b"}",
                                  b'{"model": "default", "temperature": NaN}', b"\xff\xfe", b'"just a string"'])
def test_hostile_json_is_a_400_not_a_500(body: bytes) -> None:
    server = LiveServer(ServeConfig(models=[ModelEntry("default", "default")]), load=False)  # the default 1 MB cap
    server.state.ready.set()
    try:
        status, _, answer = server.request("POST", "/v1/chat/completions", body)
    finally:
        server.stop()
    error = json.loads(answer)["error"]
    assert status == 400 and error["type"] == "invalid_request_error" and "JSON" in error["message"], answer[:300]


def test_cors_is_off_unless_configured(keyed: LiveServer, tmp_path: Path) -> None:
    preflight = {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}
    _, headers, _ = keyed.request("OPTIONS", "/v1/chat/completions", headers=preflight)
    assert "access-control-allow-origin" not in headers
    toml = tmp_path / "serve.toml"
    toml.write_text('cors_origins = ["http://kiosk.local"]\n[[models]]\nref = "default"\n')
    server = LiveServer(load_config(toml), load=False)
    try:
        _, headers, _ = server.request("OPTIONS", "/v1/chat/completions",
                                       headers={**preflight, "Origin": "http://kiosk.local"})
        assert headers["access-control-allow-origin"] == "http://kiosk.local"
        _, headers, _ = server.request("OPTIONS", "/v1/chat/completions", headers=preflight)
        assert "access-control-allow-origin" not in headers
    finally:
        server.stop()


def test_a_web_page_elsewhere_cannot_make_a_browser_post_to_the_server(tmp_path: Path) -> None:
    # A form on any site can POST a text/plain body to 127.0.0.1 without a CORS preflight; the browser names the
    # page in Origin. Only configured origins are served; clients that are not browsers send no Origin.
    toml = tmp_path / "serve.toml"
    toml.write_text('cors_origins = ["http://kiosk.local"]\n[[models]]\nref = "default"\n')
    server = LiveServer(load_config(toml), load=False)
    server.state.ready.set()
    form = json.dumps({"model": "default", "messages": "not a list"}).encode()  # refused (400) once past the guard
    try:
        for origin, want in (("http://evil.example", 403), ("null", 403), ("http://kiosk.local", 400), (None, 400)):
            headers = {"Content-Type": "text/plain", **({"Origin": origin} if origin else {})}
            status, _, body = server.request("POST", "/v1/chat/completions", form, headers)
            assert status == want, (origin, body)
            if want == 403:
                assert "cors_origins" in json.loads(body)["error"]["message"]
    finally:
        server.stop()


def test_not_ready_is_503(tmp_path: Path) -> None:
    server = LiveServer(ServeConfig(models=[ModelEntry("default", "default")]), load=False)
    try:
        status, _, body = server.request("POST", "/v1/chat/completions", _chat())
        assert status == 503 and json.loads(body)["error"]["code"] == "not_ready"
        assert server.request("GET", "/readyz")[0] == 503 and server.request("GET", "/healthz")[0] == 200
    finally:
        server.stop()


@pytest.mark.parametrize("toml, why", [
    ('port = "80"', "port must be"),
    ('[[models]]\nname = "../x"\nref = "default"', "model name"),
    ('[[models]]\nref = "default"\nbogus = 1', "unknown key 'bogus'"),
    ('[limits]\nmax_body_bytes = 1', "max_body_bytes 1 is out of range"),
    ('[[models]]\nref = "default"\n[[canary]]\nmodel = "default"\ncanary = "next"\nfraction = 0.1', "not one of the"),
    ("memory = '12Q'", "memory"),
    ("host = ", "not valid TOML"),
])
def test_bad_config_is_one_line(tmp_path: Path, toml: str, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "serve.toml"
    path.write_text(toml + "\n")
    assert edgerun(["serve", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and why in err and str(path) in err


def _request(headers: dict[str, str]):
    from starlette.requests import Request

    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": raw, "query_string": b""})


@pytest.mark.parametrize("header, body, key_best, want", [
    (None, None, None, Priority.INTERACTIVE),  # the default class
    ("urgent", None, None, Priority.URGENT),  # no keys configured: any class
    (None, "batch", None, Priority.BATCH),  # the body's field
    ("batch", "urgent", None, Priority.BATCH),  # the header wins over the body
    ("urgent", None, Priority.INTERACTIVE, Priority.INTERACTIVE),  # capped by the key
    (None, "urgent", Priority.BATCH, Priority.BATCH),
    ("batch", None, Priority.URGENT, Priority.BATCH),  # a key allowed urgent may still ask for less
])
def test_priority_is_capped_by_the_key(header, body, key_best, want) -> None:
    from apps.server.request import priority_of
    from apps.server.security import ApiKey

    key = None if key_best is None else ApiKey(b"", key_best, "key 1")
    assert priority_of(_request({"X-Priority": header} if header else {}), body, key) is want


def test_admin_endpoints_need_an_admin_key(keyed: LiveServer) -> None:
    assert keyed.request("GET", "/admin/canary", headers={"Authorization": f"Bearer {BATCH_KEY}"})[0] == 403
    status, _, body = keyed.request("GET", "/admin/canary", headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200 and json.loads(body) == {}
    assert keyed.request("GET", "/admin/canary")[0] == 401


def test_admin_endpoints_are_closed_without_keys() -> None:
    # A keyless server is loopback only, but any local process or web page (a form POST) can reach it: the admin
    # endpoints never answer without an admin key.
    server = LiveServer(ServeConfig(models=[ModelEntry("default", "default")]), load=False)
    server.state.ready.set()
    try:
        for method, path in (("GET", "/admin/canary"), ("POST", "/admin/canary/default/promote")):
            status, _, body = server.request(method, path)
            assert status == 403 and "admin API key" in json.loads(body)["error"]["message"]
    finally:
        server.stop()


@pytest.mark.parametrize("host, ok", [
    ("127.0.0.1:{port}", True), ("localhost:{port}", True), ("LOCALHOST", True), ("[::1]:{port}", True),
    ("127.9.9.9", True), ("localhost.:{port}", True),
    ("evil.example:{port}", False), ("127.0.0.1.evil.example", False), ("localhost.evil.example", False),
    ("[2001:db8::1]:{port}", False),
])
def test_keyless_server_answers_only_loopback_host_names(host: str, ok: bool) -> None:
    # DNS rebinding: a web page whose own name now resolves to 127.0.0.1 would read a keyless server as its origin.
    server = LiveServer(ServeConfig(models=[ModelEntry("default", "default")]), load=False)
    server.state.ready.set()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.putrequest("GET", "/v1/models", skip_host=True)
        conn.putheader("Host", host.format(port=server.port))
        conn.endheaders()
        resp = conn.getresponse()
        body = json.loads(resp.read())
        conn.close()
        assert resp.status == (200 if ok else 403), body
        if not ok:
            assert "loopback" in body["error"]["message"]
    finally:
        server.stop()


def test_unknown_route_is_json_404(keyed: LiveServer) -> None:
    status, _, body = keyed.request("GET", "/v1/nothing-here")
    assert status == 404 and json.loads(body)["error"]["code"] == "not_found"


def test_the_documented_serve_toml_parses() -> None:
    import tomllib

    import apps.server.config as config

    doc = config.__doc__
    text = "\n".join(line[4:] for line in doc.split("\n\n", 1)[1].split("\n\nEvery key")[0].splitlines())
    cfg = config.parse_config(tomllib.loads(text))
    assert [m.name for m in cfg.models] == ["chat", "chat-next"] and cfg.default_model == "chat"
    assert cfg.models[0].pinned and cfg.models[1].options == {"slots": 2} and cfg.limits.result_cache == 16 << 20
    assert cfg.canary[0].fraction == 0.1 and cfg.filters.regex == (r"\bpassword\s*=",) and cfg.memory == 1 << 30
