"""What is in the KV cache, and how to get a new prompt into it cheaply.

:class:`KVSequence` mirrors the backend's single sequence as a token list and
is the only code that changes it. For a new prompt it reuses, in this order:

1. the longest common prefix with what is already in the cache;
2. a saved prefix state from the :class:`PrefixCache`, when it covers more;
3. after a gap: when the new prompt is the old one with a middle range removed
   (a chat that dropped its oldest turns), the cells after the gap are shifted
   down instead of being recomputed.

The cache never holds more than ``n_ctx`` tokens: :meth:`shift` drops tokens
after the first ``n_keep`` and moves the rest down (context shift).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from runtime.backends.base import LLMBackend
from runtime.llm.prefix_cache import PrefixCache, common_prefix

log = logging.getLogger(__name__)
MIN_REUSE = 16  # tokens; below this a saved state or a gap shift is not worth it
PROBE = 8  # tokens used to find where the old cache continues after a gap


@dataclass(frozen=True)
class Reuse:
    tokens: int  # prompt tokens that did not need computing
    source: str  # "none", "kv", "saved" or "kv+shift"


class KVSequence:
    def __init__(self, backend: LLMBackend, prefix_cache: PrefixCache) -> None:
        self.backend = backend
        self.cache = prefix_cache
        self.tokens: list[int] = []

    @property
    def n_ctx(self) -> int:
        return self.backend.n_ctx

    def clear(self) -> None:
        self.backend.clear()
        self.tokens = []

    def _truncate(self, n: int) -> bool:
        if n >= len(self.tokens):
            return True
        if self.backend.remove(n, -1):
            del self.tokens[n:]
            return True
        self.clear()  # sliding-window caches cannot always drop a tail: start over
        return False

    def prepare(self, prompt: Sequence[int]) -> Reuse:
        """Leave a prefix of ``prompt`` in the cache; return how much was reused.

        At least the last prompt token is always left to decode, so that the
        logits for the first generated token are fresh.
        """
        limit = len(prompt) - 1
        live = min(common_prefix(self.tokens, prompt), limit)
        source = "kv" if live else "none"
        entry, saved = self.cache.best(prompt[:limit]) if self.cache.capacity_bytes else (None, 0)
        saved = min(saved, limit)
        if entry is not None and saved >= live + MIN_REUSE:
            if self.backend.load_state(entry.state):
                self.tokens = list(entry.tokens)
                live, source = saved, "saved"
            else:
                self.clear()
                live, source = 0, "none"
        gap = self._gap_shift(prompt, live, limit) if source != "saved" else 0
        if gap:
            return Reuse(gap, "kv+shift")
        if not self._truncate(live):
            live, source = 0, "none"
        if live:
            self.cache.hits += 1
        else:
            self.cache.misses += 1
        return Reuse(live, source)

    def _gap_shift(self, prompt: Sequence[int], start: int, limit: int) -> int:
        """Reuse cells after a removed middle range; returns tokens reused (0: none)."""
        old = self.tokens
        if len(old) - start < MIN_REUSE + PROBE or limit - start < MIN_REUSE or not self.backend.can_shift():
            return 0
        probe = np.asarray(prompt[start : start + PROBE], dtype=np.int64)
        hay = np.asarray(old, dtype=np.int64)
        windows = np.lib.stride_tricks.sliding_window_view(hay[start + 1 :], PROBE)
        hits = np.flatnonzero((windows == probe).all(axis=1))
        if not hits.size:
            return 0
        resume = start + 1 + int(hits[0])  # old[resume:] continues prompt[start:]
        run = min(common_prefix(old[resume:], prompt[start:]), limit - start)
        if run < MIN_REUSE:
            return 0
        if not self.backend.remove(start, resume):
            return 0
        self.backend.shift(resume, -1, start - resume)
        self.tokens = old[:start] + old[resume : resume + run]
        if not self._truncate(start + run):
            return 0
        self.cache.hits += 1
        log.info("reused %d cached tokens after a gap of %d", start + run, resume - start)
        return start + run

    def append(self, tokens: Sequence[int]) -> None:
        if not tokens:
            return
        if len(self.tokens) + len(tokens) > self.n_ctx:
            raise ValueError("KV cache overflow: the engine must shift before appending")  # a bug, not input
        self.backend.decode(tokens, len(self.tokens))
        self.tokens.extend(tokens)

    def append_draft(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` (a sampled token and the draft after it) in one batch with the logits of every one
        kept, for verification; :meth:`truncate` then drops the rejected ones. ``tokens`` lists them meanwhile:
        it always says what the cells hold."""
        if len(self.tokens) + len(tokens) > self.n_ctx:
            raise ValueError("KV cache overflow: a draft must fit the context")  # the decoder's bug, not input
        self.backend.decode(tokens, len(self.tokens), logits_all=True)
        self.tokens.extend(tokens)

    def truncate(self, n: int) -> bool:
        """Keep only the first ``n`` tokens (drop rejected draft cells). True when the cells were removed in place;
        False when the backend refused (a sliding-window or recurrent cache may refuse to drop a tail) and the
        first ``n`` were recomputed instead (correct, but the caller should stop drafting)."""
        if n >= len(self.tokens):
            return True
        if self.backend.remove(n, -1):
            del self.tokens[n:]
            return True
        kept = self.tokens[:n]
        log.warning("the KV cache refused to drop %d draft cells: recomputing %d tokens", len(self.tokens) - n, n)
        self.clear()
        self.append(kept)
        return False

    def save_prefix(self) -> None:
        """Remember the current cache contents in the prefix cache."""
        if self.cache.capacity_bytes and len(self.tokens) >= MIN_REUSE:
            # Ask the size first and evict before copying: the bound holds at every moment,
            # and a state larger than the whole cache is never copied out.
            if self.cache.make_room(self.backend.state_size(), self.tokens):
                self.cache.put(self.tokens, self.backend.save_state())

    def shift(self, n_keep: int, n_discard: int) -> int:
        """Drop ``n_discard`` tokens after the first ``n_keep``; return how many were dropped."""
        n_discard = max(0, min(n_discard, len(self.tokens) - n_keep))
        if not n_discard:
            return 0
        if self.backend.can_shift() and self.backend.remove(n_keep, n_keep + n_discard):
            self.backend.shift(n_keep + n_discard, -1, -n_discard)
            del self.tokens[n_keep : n_keep + n_discard]
        else:  # recompute what we keep
            kept = self.tokens[:n_keep] + self.tokens[n_keep + n_discard :]
            self.clear()
            self.append(kept)
        return n_discard
