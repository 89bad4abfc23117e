"""A real ``edgerun serve`` app on uvicorn, on a free loopback port, in a background thread of the test process."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import uvicorn

from apps.server.app import create_app
from apps.server.config import ServeConfig
from apps.server.serving import DrainingServer, listen
from apps.server.state import ServerState


class LiveServer:
    def __init__(self, config: ServeConfig, *, load: bool = True, keys: Any = None, models: Any = None,
                 api_key: str | None = None, http: Any = "auto") -> None:
        """``api_key``: sent with every request that names no Authorization of its own. ``http``: uvicorn's HTTP
        protocol, a name or a class."""
        self.state = ServerState(config, keys, models)
        self.api_key = api_key
        sock = listen("127.0.0.1", 0)
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = DrainingServer(uvicorn.Config(create_app(self.state, load=load), log_level="warning",
                                                    timeout_graceful_shutdown=2, http=http), self.state)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.02)

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not self.state.ready.is_set():
            assert self.state.failed is None, self.state.failed
            assert time.monotonic() < deadline, "models did not load"
            time.sleep(0.05)

    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
                timeout: float = 120) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) of one request; a JSON-able ``body`` is sent as JSON, bytes as they are."""
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        if self.api_key is not None and not any(k.lower() == "authorization" for k in hdrs):
            hdrs["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()

    def metric(self, name: str, **labels: str) -> float | None:
        """The sum of the /metrics samples ``name`` whose labels include ``labels``; None when there is none."""
        _, _, body = self.request("GET", "/metrics")
        total = None
        for line in body.decode().splitlines():
            series, _, value = line.rpartition(" ")
            metric, _, rest = series.partition("{")
            if line.startswith("#") or metric != name:
                continue
            got = dict(re.findall(r'(\w+)="([^"]*)"', rest))
            if all(got.get(k) == v for k, v in labels.items()):
                total = (total or 0.0) + float(value)
        return total

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
