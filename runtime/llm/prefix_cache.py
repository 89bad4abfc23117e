"""Saved KV states of prompt prefixes, bounded in bytes, least recently used out.

The live KV cache already serves a request that extends the previous one. This
cache serves the others: a system prompt or a document shared by requests that
alternate with unrelated ones. Each entry is the backend's saved sequence state
after a prompt was prefilled (or after its answer), keyed by the tokens it holds.

An entry whose tokens are a prefix of a new entry's is dropped when the new one
is stored (``supersede``): the new state serves every prompt the old one did,
since a loaded state is truncated to the prompt's common prefix (runtime/llm/kv.py).
A chat turn's prompt+answer thus replaces its prompt, and the next turn's
replaces that: the bound holds one entry per conversation, not one per turn.
Not for sliding-window caches: a tail dropped from a loaded state leaves their
window without the cells before the cut, so there the shorter entry is kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def common_prefix(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], dtype=np.int64)
    y = np.asarray(b[:n], dtype=np.int64)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


@dataclass(frozen=True)
class Entry:
    tokens: tuple[int, ...]
    state: Any  # bytes-like saved backend state; len() is its size in bytes


class PrefixCache:
    def __init__(self, capacity_bytes: int, *, supersede: bool = True) -> None:
        """``supersede``: a new entry drops the entries whose tokens are a prefix of its own (False for a
        sliding-window cache, whose loaded states cannot be cut short exactly)."""
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        self.capacity_bytes = capacity_bytes
        self.supersede = supersede
        self._entries: OrderedDict[tuple[int, ...], Entry] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.superseded = 0

    def __len__(self) -> int:
        return len(self._entries)

    def best(self, tokens: Sequence[int]) -> tuple[Entry | None, int]:
        """The entry sharing the longest prefix with ``tokens``, and that length."""
        best, best_len = None, 0
        for entry in self._entries.values():
            n = common_prefix(entry.tokens, tokens)
            if n > best_len:
                best, best_len = entry, n
        if best is not None:
            self._entries.move_to_end(best.tokens)
        return best, best_len

    def make_room(self, size: int, tokens: Sequence[int] = ()) -> bool:
        """Evict (LRU first) until ``size`` more bytes fit; False if they never can.

        Called before a state is copied out of the backend, so that the cache and
        the new copy together never exceed the bound, not even for a moment. The
        entry for ``tokens`` goes first, and (``supersede``) every entry whose
        tokens are a prefix of ``tokens``: the new state serves their prompts.
        """
        if size > self.capacity_bytes:
            return False
        key = tuple(tokens)
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= len(old.state)
        if self.supersede and key:
            for k in [k for k in self._entries if len(k) < len(key) and key[: len(k)] == k]:
                self.bytes -= len(self._entries.pop(k).state)
                self.superseded += 1
        while self._entries and self.bytes + size > self.capacity_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.bytes -= len(evicted.state)
            self.evictions += 1
        return True

    def put(self, tokens: Sequence[int], state: Any) -> bool:
        key = tuple(tokens)
        if not self.make_room(len(state), key):
            return False
        self._entries[key] = Entry(key, state)
        self.bytes += len(state)
        return True

    def stats(self) -> dict[str, int]:
        return {
            "hits": self.hits,
            "misses": self.misses,
            "entries": len(self._entries),
            "bytes": self.bytes,
            "capacity_bytes": self.capacity_bytes,
            "evictions": self.evictions,
            "superseded": self.superseded,
        }
