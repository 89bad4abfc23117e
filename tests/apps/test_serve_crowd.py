"""`edgerun serve` in its own process at a Raspberry Pi's 1,024 file descriptors, under a crowd of 1,100 idle
connections, slow-header ones and a stalled body: /healthz answers at once, a model still loads, the idle and slow
connections are closed after their deadlines, and nothing is logged as a failure."""

from __future__ import annotations

import http.client
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from apps.http_limits import HttpLimits, connection_cap

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
NOFILE = 1024  # a Pi's default soft limit
IDLE = 1100  # more connections than the process could hold descriptors for
SLOW = 20  # headers begun, never finished
LIMITS = HttpLimits(max_connections=connection_cap(NOFILE))  # what the server derives, at its defaults
SERVE_TOML = """
[[models]]
name = "chat"
ref = "default"
pinned = true
options = { ctx = 256, slots = 1 }

[[models]]
name = "later"
ref = "default"
options = { ctx = 256, slots = 1 }
"""


def _descriptors() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, hard))


def _get(addr: tuple[str, int], path: str, timeout: float) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(*addr, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _closed(socks: list[socket.socket], got: dict[int, bytes]) -> list[socket.socket]:
    """The sockets of ``socks`` the server has closed (what each sent before is added to ``got``)."""
    out = []
    for sock in socks:
        try:
            while piece := sock.recv(65536):
                got[sock.fileno()] = got.get(sock.fileno(), b"") + piece
            out.append(sock)
        except BlockingIOError:
            pass
        except ConnectionResetError:
            out.append(sock)
    return out


def test_a_crowd_of_idle_and_slow_connections_does_not_take_the_server(smollm, shared_home: Path, tmp_path: Path) -> None:
    config = tmp_path / "serve.toml"
    config.write_text(SERVE_TOML)
    log = tmp_path / "serve.log"
    env = {**os.environ, "EDGERUN_HOME": str(shared_home), "OMP_NUM_THREADS": "1"}
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "apps", "serve", "--config", str(config), "--port", "0", "--memory", "1G"],
                                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err, preexec_fn=_descriptors)
    socks: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 120
        while not (found := re.search(r"on http://127\.0\.0\.1:(\d+)/v1", log.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        addr = ("127.0.0.1", int(found.group(1)))
        while True:
            try:
                if _get(addr, "/readyz", 5)[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)

        stalled = socket.create_connection(addr, timeout=10)  # a body that stops coming
        socks.append(stalled)
        body = json.dumps({"model": "chat", "prompt": "Hello", "max_tokens": 1}).encode()
        stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        + f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:5])
        stalled_at = time.monotonic()
        idle = [socket.create_connection(addr, timeout=10) for _ in range(IDLE)]
        socks += idle
        slow = [socket.create_connection(addr, timeout=10) for _ in range(SLOW)]
        socks += slow
        for sock in slow:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never the blank line
        crowd_at = time.monotonic()

        t0 = time.monotonic()
        assert _get(addr, "/healthz", 5) == (200, b'{"status":"ok"}')
        assert time.monotonic() - t0 < 3.0
        fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
        assert fds < NOFILE - 64, f"the server holds {fds} descriptors of {NOFILE}"

        conn = http.client.HTTPConnection(*addr, timeout=120)  # a model loaded on demand, in the crowd
        conn.request("POST", "/v1/completions", json.dumps({"model": "later", "prompt": "Hello", "max_tokens": 2,
                                                            "temperature": 0}), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()[:300]
        assert json.loads(resp.read())["model"] == "later"
        conn.close()

        crowd = idle + slow
        for sock in crowd:
            sock.setblocking(False)
        got: dict[int, bytes] = {}
        left = list(crowd)
        wait_until = crowd_at + LIMITS.header_timeout_s + 5
        while left and time.monotonic() < wait_until:
            done = set(_closed(left, got))
            left = [s for s in left if s not in done]
            time.sleep(0.2)
        assert not left, f"{len(left)} idle or slow connections still open {LIMITS.header_timeout_s:g} s after they opened"
        answers = [got.get(s.fileno(), b"") for s in slow]
        assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers), answers[:3]

        stalled.settimeout(max(1.0, stalled_at + LIMITS.body_timeout_s + 5 - time.monotonic()))
        answer = b""
        while piece := stalled.recv(65536):
            answer += piece
        assert answer.startswith(b"HTTP/1.1 408 ") and b"request_timeout" in answer, answer[:300]
        assert _get(addr, "/healthz", 5)[0] == 200
    finally:
        for sock in socks:
            sock.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "Traceback" not in text and "ERROR" not in text, text[-3000:]
