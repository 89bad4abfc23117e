"""``serve.toml``: what the server serves and its limits, read once into typed dataclasses.

    host = "127.0.0.1"            # a non-loopback host needs api_keys_file
    port = 8080
    memory = "1G"                 # one budget for every resident model (default: the board's share of RAM)
    slots = 4                     # LLM sequences decoded together
    speculate = true              # speculative decoding per slot (prompt-lookup drafts); false: one token per step
    api_keys_file = "keys.txt"    # one key a line, optionally followed by the best priority it may ask for
    cors_origins = []             # CORS stays off unless origins are listed

    [limits]
    max_body_bytes = 1048576      # a larger body is refused with 413 before it is read
    max_queued = 64               # per priority class; beyond it 429 with Retry-After
    deadline_ms = 120000          # default per-request deadline (header X-Deadline-Ms or body deadline_ms override)
    max_tokens = 4096             # the most a request may ask for
    result_cache = "16M"          # bytes of deterministic answers kept; "0" turns the cache off
    result_cache_ttl_s = 600
    decode_slots = 2              # classify bodies decoded at once; beyond it 429 (each slot is in the memory plan)
    max_image_pixels = 4194304    # the most pixels one image decodes to (a JPEG after its 1/2..1/8 scaling); more: 413

    [[models]]                    # the first is the default model
    name = "chat"                 # the public name clients send as "model"
    ref = "default"               # a bundle, .gguf, installed name[@version] or recipe
    pinned = true                 # never evicted
    keep_alive = 300              # seconds idle before unloading; -1 forever, 0 at once

    [[models]]
    name = "chat-next"            # another version, tried on a fraction of "chat"'s traffic
    ref = "smollm2-135m-instruct@q4_1-0.1.2"
    options = { slots = 2 }       # llm: slots, ctx, threads; vision: batch, threads; audio: threads

    [[canary]]                    # a fraction of "chat" goes to the model entry "chat-next"
    model = "chat"
    canary = "chat-next"
    fraction = 0.1

    [filters]
    max_chars = 32000
    blocklist = ["some phrase"]
    regex = ['\\bpassword\\s*=']   # TOML literal strings: backslashes as they are

Every key is checked: an unknown one or a wrong type is one line naming the key and what is valid.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from apps.config_fields import integer as _int
from apps.config_fields import number as _number
from apps.config_fields import size as _size
from apps.config_fields import strings as _strings
from apps.config_fields import table as _table
from apps.config_fields import typed as _typed
from runtime.bundle.store import check_ref
from runtime.errors import BadInput
from runtime.residency.spec import ResidentKind

SERVED_KINDS = (ResidentKind.LLM, ResidentKind.VISION, ResidentKind.AUDIO)  # what serve.toml can name
DEFAULT_PORT = 8080
DEFAULT_HOST = "127.0.0.1"


@dataclass(frozen=True)
class ModelEntry:
    name: str  # public name: checked like a store name, so it can never be a path
    ref: str
    pinned: bool = False
    keep_alive: float = 300.0  # seconds; -1: forever
    kind: ResidentKind | None = None  # one of SERVED_KINDS; None: read from the bundle when it is resolved
    options: dict[str, Any] = field(default_factory=dict)  # per-model load options (slots, ctx, threads, batch)


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 1 << 20
    max_queued: int = 64
    deadline_ms: int = 120_000
    max_tokens: int = 4096
    result_cache: int = 16 << 20
    result_cache_ttl_s: float = 600.0
    classify_batch: int = 8
    classify_wait_ms: float = 5.0
    decode_slots: int = 2  # the server's classify decodes at once: each holds up to preprocess.decode_bytes(max_image_pixels)
    max_image_pixels: int = 4 << 20  # 2048x2048: a 12 Mpx photo's JPEG decodes at 1/2 or less, a PNG screenshot whole


@dataclass(frozen=True)
class CanaryRoute:
    model: str
    canary: str
    fraction: float
    margin_error: float = 0.05
    margin_p95: float = 1.5
    min_requests: int = 20


@dataclass(frozen=True)
class Filters:
    max_chars: int = 32_000
    blocklist: tuple[str, ...] = ()
    regex: tuple[str, ...] = ()


@dataclass
class ServeConfig:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    memory: int | None = None  # bytes; None: the board profile's default budget
    slots: int = 4
    speculate: bool = True  # LLM engines draft and verify per slot (runtime/serving/engine.py)
    api_keys_file: Path | None = None
    cors_origins: tuple[str, ...] = ()
    models: list[ModelEntry] = field(default_factory=list)
    limits: Limits = field(default_factory=Limits)
    canary: list[CanaryRoute] = field(default_factory=list)
    filters: Filters = field(default_factory=Filters)

    def model(self, name: str) -> ModelEntry | None:
        return next((m for m in self.models if m.name == name), None)

    @property
    def default_model(self) -> str:
        return self.models[0].name


def _model(where: str, data: Any) -> ModelEntry:
    data = _table(where, data, ("name", "ref", "pinned", "keep_alive", "kind", "options"))
    if "ref" not in data:
        raise BadInput(f"{where} needs ref = a bundle, .gguf file, installed name or recipe")
    ref = _typed(f"{where}.ref", data["ref"], str, "a model reference")
    name = data.get("name", ref)
    check_ref(_typed(f"{where}.name", name, str, "a model name"))
    kind = data.get("kind")
    if kind is not None and kind not in SERVED_KINDS:
        raise BadInput(f"{where}.kind {kind!r} is not valid: use {', '.join(SERVED_KINDS[:-1])} or {SERVED_KINDS[-1]}")
    keep = _number(f"{where}.keep_alive", data.get("keep_alive", 300), -1, 10**9)
    options = _table(f"{where}.options", data.get("options", {}), ("slots", "ctx", "threads", "batch"))
    for key, value in options.items():
        _int(f"{where}.options.{key}", value, 1, 1 << 20)
    return ModelEntry(name, ref, _typed(f"{where}.pinned", data.get("pinned", False), bool, "true or false"), keep,
                      None if kind is None else ResidentKind(kind),
                      dict(options))


def parse_config(data: dict[str, Any], base: Path = Path(".")) -> ServeConfig:
    """A ServeConfig from parsed TOML; relative paths are relative to ``base`` (the file's folder)."""
    top = _table("serve.toml", data, tuple(f.name for f in fields(ServeConfig)))
    cfg = ServeConfig()
    if "host" in top:
        cfg.host = _typed("host", top["host"], str, "a host name or address")
    if "port" in top:
        cfg.port = _int("port", top["port"], 0, 65535)
    if "memory" in top:
        cfg.memory = _size("memory", top["memory"], minimum=1)
    if "slots" in top:
        cfg.slots = _int("slots", top["slots"], 1, 256)
    if "speculate" in top:
        cfg.speculate = _typed("speculate", top["speculate"], bool, "true or false")
    if "api_keys_file" in top:
        cfg.api_keys_file = base / _typed("api_keys_file", top["api_keys_file"], str, "a file path")
    if "cors_origins" in top:
        cfg.cors_origins = _strings("cors_origins", top["cors_origins"])
    models = _typed("models", top.get("models", []), list, "an array of [[models]] tables")
    cfg.models = [_model(f"models[{i}]", m) for i, m in enumerate(models)]
    names = [m.name for m in cfg.models]
    if len(set(names)) != len(names):
        raise BadInput(f"models: the name {next(n for n in names if names.count(n) > 1)!r} is given twice")
    lim = _table("limits", top.get("limits", {}), tuple(f.name for f in fields(Limits)))
    cfg.limits = Limits(
        max_body_bytes=_int("limits.max_body_bytes", lim.get("max_body_bytes", Limits.max_body_bytes), 1024, 1 << 30),
        max_queued=_int("limits.max_queued", lim.get("max_queued", Limits.max_queued), 1, 1 << 16),
        deadline_ms=_int("limits.deadline_ms", lim.get("deadline_ms", Limits.deadline_ms), 1, 86_400_000),
        max_tokens=_int("limits.max_tokens", lim.get("max_tokens", Limits.max_tokens), 1, 2**31 - 1),
        result_cache=_size("limits.result_cache", lim.get("result_cache", Limits.result_cache)),
        result_cache_ttl_s=_number("limits.result_cache_ttl_s", lim.get("result_cache_ttl_s", 600), 0, 10**9),
        classify_batch=_int("limits.classify_batch", lim.get("classify_batch", Limits.classify_batch), 1, 4096),
        classify_wait_ms=_number("limits.classify_wait_ms", lim.get("classify_wait_ms", 5), 0, 10_000),
        decode_slots=_int("limits.decode_slots", lim.get("decode_slots", Limits.decode_slots), 1, 256),
        max_image_pixels=_int("limits.max_image_pixels", lim.get("max_image_pixels", Limits.max_image_pixels), 1, 1 << 28),
    )
    routes = _typed("canary", top.get("canary", []), list, "an array of [[canary]] tables")
    for i, r in enumerate(routes):
        where = f"canary[{i}]"
        r = _table(where, r, tuple(f.name for f in fields(CanaryRoute)))
        for key in ("model", "canary", "fraction"):
            if key not in r:
                raise BadInput(f"{where} needs {key}")
        route = CanaryRoute(
            model=_typed(f"{where}.model", r["model"], str, "a model name"),
            canary=_typed(f"{where}.canary", r["canary"], str, "a model name"),
            fraction=_number(f"{where}.fraction", r["fraction"], 0, 1),
            margin_error=_number(f"{where}.margin_error", r.get("margin_error", 0.05), 0, 1),
            margin_p95=_number(f"{where}.margin_p95", r.get("margin_p95", 1.5), 1, 1000),
            min_requests=_int(f"{where}.min_requests", r.get("min_requests", 20), 1, 1 << 20),
        )
        for key in ("model", "canary"):
            if cfg.model(getattr(route, key)) is None:
                raise BadInput(f"{where}.{key} {getattr(route, key)!r} is not one of the [[models]] names ({', '.join(names)})")
        cfg.canary.append(route)
    flt = _table("filters", top.get("filters", {}), ("max_chars", "blocklist", "regex"))
    cfg.filters = Filters(
        max_chars=_int("filters.max_chars", flt.get("max_chars", Filters.max_chars), 1, 1 << 30),
        blocklist=_strings("filters.blocklist", flt.get("blocklist", [])),
        regex=_strings("filters.regex", flt.get("regex", [])),
    )
    return cfg


def load_config(path: Path | str | None) -> ServeConfig:
    """The config in ``path`` (None: the defaults). One line for a missing file or bad TOML."""
    if path is None:
        return ServeConfig()
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read the serve config ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"{path}: not valid TOML ({exc})") from None
    try:
        return parse_config(data, path.parent)
    except BadInput as exc:
        raise BadInput(f"{path}: {exc}") from None
