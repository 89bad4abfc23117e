"""The one place that decides where the load generator may send requests: loopback only.

A load test floods its target; pointed at another machine by a typo it is a denial of service.
So the host must be a loopback address (127.0.0.0/8, ::1) or ``localhost`` resolving only to
loopback. Redirects are never followed and proxies from the environment are never used (see
client.py), so a request cannot leave the machine another way.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from runtime.errors import BadInput

API_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    if host.lower().rstrip(".") != "localhost":
        return False
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def loopback_base(url: str) -> str:
    """``url`` as ``scheme://host:port`` when it names this machine; BadInput otherwise.

    Accepts a server's root (``http://127.0.0.1:8080``) or its API root (``.../v1``); the
    endpoint paths are added by the caller.
    """
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise BadInput(f"the URL {url!r} is not valid ({exc}): use http://127.0.0.1:PORT") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadInput(f"the URL {url!r} is not http(s) with a host: use http://127.0.0.1:PORT")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise BadInput(f"the URL {url!r} carries credentials, a query or a fragment: give only http://127.0.0.1:PORT")
    if not _is_loopback(parts.hostname):
        raise BadInput(f"the URL's host {parts.hostname!r} is not loopback: loadtest only talks to this machine "
                       "(127.0.0.1, ::1 or localhost)")
    path = parts.path.rstrip("/")
    if path not in ("", "/v1"):
        raise BadInput(f"the URL {url!r} has the path {parts.path!r}: give the server's root or its /v1")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    default = 443 if parts.scheme == "https" else 80
    return f"{parts.scheme}://{host}:{port if port is not None else default}"
