"""What keeps the server closed by default: loopback binding, API keys, a body cap, model names that are never paths.

The API keys file holds one key a line, optionally followed by the best priority that key may ask for
(``urgent``, ``interactive`` or ``batch``; default ``interactive``) and ``admin`` for a key that may promote or
roll back canaries; ``#`` starts a comment:

    sk-kiosk-3f9a...   urgent
    sk-scripts-77c1... batch
    sk-ops-0b42...     interactive admin
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import Request

from runtime.bundle.store import check_ref
from runtime.errors import BadInput
from runtime.serving.scheduler import Priority

MIN_KEY_CHARS = 16  # a key shorter than this is guessable; refused when the file is read
DEFAULT_KEY_PRIORITY = Priority.INTERACTIVE


class BodyTooLarge(BadInput):
    """The request body is over the configured cap (HTTP 413)."""


class Unauthorized(BadInput):
    """No key or a wrong one (HTTP 401)."""


class Forbidden(BadInput):
    """A right key that may not do this (HTTP 403)."""


@dataclass(frozen=True)
class ApiKey:
    digest: bytes  # sha256 of the key: compared in constant time, never the key itself kept
    max_priority: Priority
    label: str  # "key 3": for logs, never the key
    admin: bool = False


class ApiKeys:
    def __init__(self, keys: list[ApiKey]) -> None:
        self.keys = keys

    @property
    def required(self) -> bool:
        return bool(self.keys)

    def check(self, given: str | None) -> ApiKey | None:
        """The key ``given`` matches, or None. Every key is compared (hmac.compare_digest on fixed-length digests),
        so neither the time taken nor which key matched leaks how close a guess was."""
        if given is None:
            return None
        digest = hashlib.sha256(given.encode("utf-8", "surrogatepass")).digest()
        found = None
        for key in self.keys:
            if hmac.compare_digest(digest, key.digest):
                found = key
        return found

    def authenticate(self, request: Request) -> ApiKey | None:
        """The caller's key (None when no keys are configured); Unauthorized when keys are required and it is wrong."""
        if not self.required:
            return None
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        key = self.check(token.strip() if scheme.lower() == "bearer" else None)
        if key is None:
            raise Unauthorized("missing or wrong API key: send the header 'Authorization: Bearer KEY'")
        return key


def load_keys(path: Path | None) -> ApiKeys:
    if path is None:
        return ApiKeys([])
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read the API keys file ({getattr(exc, 'strerror', None) or exc})") from None
    keys = []
    for n, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words[0]) < MIN_KEY_CHARS:
            raise BadInput(f"{path}:{n}: the key is {len(words[0])} characters; use at least {MIN_KEY_CHARS} "
                           "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(24))')")
        admin = "admin" in words[1:]
        rest = [w for w in words[1:] if w != "admin"]
        if len(rest) > 1:
            raise BadInput(f"{path}:{n}: expected 'KEY [urgent|interactive|batch] [admin]', got {len(words)} words")
        try:
            best = Priority.parse(rest[0]) if rest else DEFAULT_KEY_PRIORITY
        except BadInput as exc:
            raise BadInput(f"{path}:{n}: {exc}") from None
        keys.append(ApiKey(hashlib.sha256(words[0].encode()).digest(), best, f"key {len(keys) + 1}", admin))
    if not keys:
        raise BadInput(f"{path}: no API keys in the file (one key a line)")
    return ApiKeys(keys)


def is_loopback(host: str) -> bool:
    """True when ``host`` only ever reaches this machine: a loopback address, or a name that resolves only to them."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def check_bind(host: str, keys: ApiKeys) -> None:
    """Refuse, before anything binds, to listen beyond this machine without API keys."""
    if not is_loopback(host) and not keys.required:
        raise BadInput(f"refusing to listen on {host!r} without an API key: anyone on the network could use it; "
                       "give --api-key-file FILE (or api_keys_file in serve.toml), or bind 127.0.0.1")


def host_name(header: str) -> str:
    """The name in a Host header, without the port: ``[::1]:8080`` -> ``::1``, ``Example:80`` -> ``example``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


def loopback_name(name: str, also: str = "") -> bool:
    """``localhost``, a loopback address literal, or ``also`` (the name the server was bound by); never another
    DNS name, whatever it resolves to now ("127.0.0.1.evil.example")."""
    if name.rstrip(".") in ("localhost", also.lower().rstrip(".")):  # "localhost." is localhost too (RFC 6761)
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_host(request: Request, bound: str) -> None:
    """Without API keys, answer only requests addressed to this machine by a loopback name. A web page can
    point its own DNS name at 127.0.0.1 (DNS rebinding) and then read this server as its own origin; the Host
    header it sends names it, so it is refused here."""
    given = request.headers.get("host")
    if given is not None and not loopback_name(host_name(given), bound):
        raise Forbidden(f"this server has no API key, so it answers only requests to localhost or a loopback address, "
                        f"not to {host_name(given)[:100]!r}; use http://127.0.0.1:PORT, or give --api-key-file")


def check_origin(request: Request, allowed: tuple[str, ...]) -> None:
    """A browser says which page sent a request (Origin); only the configured CORS origins may. A page elsewhere
    could otherwise make a visitor's browser POST to this server (a form's text/plain body needs no preflight):
    its answer stays unreadable, but the work is done. Clients that are not browsers send no Origin."""
    origin = request.headers.get("origin")
    if origin is not None and origin not in allowed:
        raise Forbidden(f"requests from web pages at {origin[:100]!r} are refused: list the origin in serve.toml's "
                        "cors_origins to allow it")


def check_model_name(name: object) -> str:
    """A model name from a request, checked like a store name before any lookup: it can never name a path."""
    if not isinstance(name, str):
        raise BadInput(f"model must be a string, got {type(name).__name__}")
    base, at, version = name.partition("@")
    check_ref(base, version if at else None)
    return name


async def read_body(request: Request, cap: int) -> bytes:
    """The request body, refused (BodyTooLarge) as soon as it is over ``cap`` bytes: a declared Content-Length
    over the cap before anything is read, a chunked body once the chunks received pass it."""
    declared = request.headers.get("content-length")
    if declared is not None and not (declared.isascii() and declared.isdigit()):  # "²".isdigit(), but int("²") fails
        raise BadInput(f"Content-Length {declared[:40]!r} is not valid: use the body's size as ASCII digits")
    if declared is not None and (len(declared) > 18 or int(declared) > cap):  # 18 digits: past any cap, int() cheap
        raise BodyTooLarge(f"the request body ({declared[:40]} bytes) is over the limit of {cap} bytes")
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > cap:
            raise BodyTooLarge(f"the request body is over the limit of {cap} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
