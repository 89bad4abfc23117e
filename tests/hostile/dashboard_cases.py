"""The hostile requests tried against the kiosk dashboard (``/``, ``/api/*``, ``/events``, its assets)."""

from __future__ import annotations

from tests.hostile.http import Case, request
from tests.hostile.serve_cases import WEIRD, huge_headers


def every_case() -> list[Case]:
    cases = list(huge_headers())
    for path in ("/api/rejects/99999999999999999999999", "/api/rejects/-1", "/api/rejects/²", "/api/rejects/0",
                 "/api/frame/latest?w=" + "9" * 5000, "/../../etc/passwd", "/app.js/../../../etc/passwd",
                 "/%2e%2e/%2e%2e/etc/passwd", "/" + "x" * 60_000, "/api/state?token=" + "t" * 100_000):
        cases.append(Case("paths and numbers", path[:40], request("GET", path, content_type=None), closed_ok=True))
    for w in WEIRD:
        enc = w.encode("utf-8", "surrogatepass").hex()
        cases.append(Case("Unicode in every field", f"token {w[:6]!r}", request("GET", f"/api/state?token={enc}", content_type=None)))
        cases.append(Case("Unicode in every field", f"cookie {w[:6]!r}",
                          request("GET", "/api/state", content_type=None, headers=[("Cookie", "kiosk_token=" + enc)])))
        cases.append(Case("Unicode in every field", f"Host {w[:6]!r}",
                          b"GET /api/state HTTP/1.1\r\nHost: " + w.encode("utf-8", "surrogatepass") + b"\r\n"
                          b"Connection: close\r\n\r\n", closed_ok=True))
    for host in ("evil.example", "127.0.0.1.nip.io", "localhost.evil", "[::ffff:127.0.0.1]", "0x7f.1", ""):
        cases.append(Case("DNS rebinding", f"Host {host!r}", request("GET", "/api/state", content_type=None, host=host)))
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        for path in ("/", "/api/state", "/events"):
            cases.append(Case("methods and bodies", f"{method} {path}", request(method, path, b"{" * 5000)))
    cases.append(Case("methods and bodies", "2 MB POST", request("POST", "/api/state", b"x" * 2_000_000), closed_ok=True))
    cases.append(Case("methods and bodies", "lying Content-Length, then hang up",
                      request("POST", "/api/state", b"x", length=1000), then_close=True, closed_ok=True))
    return cases
