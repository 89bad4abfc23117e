"""An exact-match cache of deterministic results, bounded in bytes, with a time to live.

    cache = ResultCache(64 << 20, ttl_s=600)
    if cache.cacheable(params):                       # temperature 0, or a fixed seed
        key = cache.key(model_version, params, payload, scope=caller)
        hit = cache.get(key)
        if hit is None:
            hit = run(...)
            cache.put(key, hit, size_bytes=len(body))  # the caller says what the value weighs

A key is the SHA-256 of the canonical JSON of (model version, parameters, input, scope): any change to one
of them is another key, so a new model version never answers from the old one's results, and one caller's
entries never answer another's (a hit would tell a caller what someone else asked): ``scope`` names who may
read them, e.g. a digest of the caller's API key, never the key itself. Bytes in
the input (an image, a WAV) enter the key as their own SHA-256, tagged as bytes. Entries leave least recently used
first when the bytes would pass ``capacity_bytes``, and are refused by ``get`` once ``ttl_s`` has passed
since they were put. Thread-safe.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from runtime.errors import BadInput

DEFAULT_TTL_S = 600.0


def _canonical(value: Any) -> Any:
    # Every JSON object made here has one tag key, "bytes" or "map", so bytes and a mapping that spells out their
    # digest never share a form (nor a key).
    if isinstance(value, bytes | bytearray | memoryview):
        return {"bytes": hashlib.sha256(value).hexdigest()}
    if hasattr(value, "__dataclass_fields__"):  # SamplingParams and the like: as the mapping of its fields
        return {"map": {f: _canonical(getattr(value, f)) for f in value.__dataclass_fields__}}
    if isinstance(value, Mapping):
        return {"map": {str(k): _canonical(v) for k, v in value.items()}}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise BadInput(f"result cache: cannot key the non-finite number {value!r}")
        return value
    raise BadInput(f"result cache: cannot key a {type(value).__name__} (give JSON values or bytes)")


def _temperature_is_zero(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == 0


class ResultCache:
    """Exact-match results: ``capacity_bytes`` in all (the sizes ``put`` is told), each kept ``ttl_s`` seconds."""

    def __init__(self, capacity_bytes: int, ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        if not isinstance(capacity_bytes, int) or capacity_bytes < 0:
            raise BadInput(f"result cache capacity {capacity_bytes!r} must be bytes >= 0 (0 turns the cache off)")
        if not isinstance(ttl_s, int | float) or not ttl_s > 0 or not math.isfinite(ttl_s):
            raise BadInput(f"result cache ttl {ttl_s!r} must be a positive number of seconds")
        self.capacity_bytes, self.ttl_s, self._clock = capacity_bytes, float(ttl_s), clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[Any, int, float]] = OrderedDict()  # key -> (value, bytes, expires at)
        self._bytes = 0
        self._counts = {"hits": 0, "misses": 0, "evictions": 0, "expired": 0, "refused": 0}

    @staticmethod
    def key(model_version: str, params: Any, payload: Any, scope: str = "") -> str:
        """SHA-256 of the canonical JSON of the four; BadInput for a value JSON cannot hold. ``scope``: the entry
        answers only keys made with the same scope ("": one shared scope, for a server without API keys)."""
        if not isinstance(scope, str):
            raise BadInput(f"result cache: scope must be a string, not {type(scope).__name__}")
        text = json.dumps([str(model_version), _canonical(params), _canonical(payload), scope], sort_keys=True,
                          separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    @staticmethod
    def cacheable(params: Any) -> bool:
        """Whether a request with ``params`` (a mapping or SamplingParams) always gives the same result:
        temperature 0 (greedy), or a fixed seed. A missing temperature is the model's default: not known to be 0."""
        get = params.get if isinstance(params, Mapping) else (lambda name: getattr(params, name, None))
        seed = get("seed")
        return _temperature_is_zero(get("temperature")) or (isinstance(seed, int) and not isinstance(seed, bool))

    def get(self, key: str) -> Any | None:
        """The value put under ``key`` and not yet expired or evicted, else None (a miss)."""
        with self._lock:
            found = self._entries.get(key)
            if found is not None and self._clock() >= found[2]:
                self._drop(key)
                self._counts["expired"] += 1
                found = None
            if found is None:
                self._counts["misses"] += 1
                return None
            self._entries.move_to_end(key)
            self._counts["hits"] += 1
            return found[0]

    def put(self, key: str, value: Any, size_bytes: int) -> bool:
        """Keep ``value`` under ``key``, evicting the least recently used entries to make room; False (nothing
        kept) when it alone is larger than the capacity or is None."""
        if not isinstance(size_bytes, int) or size_bytes < 0:
            raise BadInput(f"result cache: size_bytes {size_bytes!r} must be bytes >= 0")
        with self._lock:
            if key in self._entries:
                self._drop(key)
            if value is None or size_bytes > self.capacity_bytes:
                self._counts["refused"] += 1
                return False
            while self._bytes + size_bytes > self.capacity_bytes:
                self._drop(next(iter(self._entries)))
                self._counts["evictions"] += 1
            self._entries[key] = (value, size_bytes, self._clock() + self.ttl_s)
            self._bytes += size_bytes
            return True

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def stats(self) -> dict[str, int]:
        """hits, misses, evictions (for room), expired (TTL), refused (too large), bytes, entries, capacity_bytes."""
        with self._lock:
            return {**self._counts, "bytes": self._bytes, "entries": len(self._entries), "capacity_bytes": self.capacity_bytes}

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _drop(self, key: str) -> None:
        _, size, _ = self._entries.pop(key)
        self._bytes -= size
