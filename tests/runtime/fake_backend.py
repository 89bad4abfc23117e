"""A deterministic in-memory LLM backend: the KV cache as a dict of cells, for engine tests without llama.cpp.

It keeps what llama.cpp keeps (a token and a position per cell) and counts the work
asked of it, so a test can assert exactly which tokens were recomputed, shifted or
restored. Switches make it behave like a sliding-window cache (``can_remove``,
``can_shift``) or a state that does not load back (``load_ok``).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from runtime.backends.base import LLMBackend, SpecialToken
from runtime.llm.sampling import SamplingParams

EOS = 0
CELL = struct.Struct("<ii")  # a saved cell: position, token (8 bytes)


class FakeBackend(LLMBackend):
    name = "fake"

    def __init__(self, n_ctx: int = 64, *, specials: Sequence[SpecialToken] = ()) -> None:
        self.n_ctx = n_ctx
        self.cells: dict[int, int] = {}  # position -> token
        self.can_remove = True
        self.shift_ok = True
        self.load_ok = True
        self.decoded = 0  # tokens evaluated, all calls together
        self.saves = 0
        self.loads = 0
        self.closed = False
        self._specials = tuple(specials)

    # -- what the tests read ------------------------------------------------------
    def contents(self) -> list[int]:
        """The cached tokens in position order; fails unless positions are 0..n-1."""
        assert sorted(self.cells) == list(range(len(self.cells))), sorted(self.cells)
        return [self.cells[p] for p in range(len(self.cells))]

    # -- text: one character is one token -------------------------------------------
    def tokenize(self, text: str, *, add_bos: bool, special: bool) -> list[int]:
        return [ord(c) for c in text]

    def token_bytes(self, token: int) -> bytes:
        return chr(token).encode("utf-8")

    def special_text(self, which: str) -> str:
        return ""

    def special_tokens(self) -> Sequence[SpecialToken]:
        return self._specials

    def is_eog(self, token: int) -> bool:
        return token == EOS

    # -- KV cache --------------------------------------------------------------------
    def decode(self, tokens: Sequence[int], start: int) -> None:
        assert len(self.cells) == start, (len(self.cells), start)  # the engine only ever appends
        assert start + len(tokens) <= self.n_ctx
        for i, token in enumerate(tokens):
            self.cells[start + i] = token
        self.decoded += len(tokens)

    def remove(self, start: int, end: int = -1) -> bool:
        if not self.can_remove:
            return False
        stop = self.n_ctx if end < 0 else end
        self.cells = {p: t for p, t in self.cells.items() if not start <= p < stop}
        return True

    def shift(self, start: int, end: int, delta: int) -> None:
        stop = self.n_ctx if end < 0 else end
        moved = {p + delta if start <= p < stop else p: t for p, t in self.cells.items()}
        assert len(moved) == len(self.cells), "shift onto occupied cells"
        self.cells = moved

    def can_shift(self) -> bool:
        return self.shift_ok

    def clear(self) -> None:
        self.cells = {}

    def state_size(self) -> int:
        return CELL.size * len(self.cells)

    def save_state(self) -> Any:
        self.saves += 1
        return b"".join(CELL.pack(p, t) for p, t in sorted(self.cells.items()))

    def load_state(self, data: Any) -> bool:
        self.loads += 1
        self.clear()
        if not self.load_ok:
            return False
        self.cells = dict(CELL.iter_unpack(data))
        return True

    # -- sampling: the next token is the last one plus one, EOS after 'z' -------------------
    def new_sampler(self, params: SamplingParams) -> Any:
        return params

    def sample(self, sampler: Any) -> int:
        last = self.cells[len(self.cells) - 1]
        return EOS if last >= ord("z") else last + 1

    def close(self) -> None:
        self.closed = True
