"""The backend interface. Public behaviour lives in runtime/llm.py; a backend
implements only these primitives over its native handles.

A language-model backend holds one KV sequence whose cells are addressed by
position 0..n_ctx-1. The engine keeps the list of tokens in those cells and
asks the backend to decode, remove, shift, save and restore them.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from runtime.sampling import SamplingParams


class Backend(abc.ABC):
    """Anything that owns native handles: closed once, in reverse order of creation."""

    name = "abstract"

    def close(self) -> None:  # noqa: B027 - optional for backends with nothing to free
        pass

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LLMBackend(Backend):
    n_ctx: int  # KV cells available
    gpu_offload: bool = False  # whether layers can live on a GPU in this build

    @abc.abstractmethod
    def tokenize(self, text: str, *, add_bos: bool, special: bool) -> list[int]: ...

    @abc.abstractmethod
    def token_bytes(self, token: int) -> bytes: ...

    @abc.abstractmethod
    def special_text(self, which: str) -> str:
        """The text of the "bos" or "eos" token ('' if the model has none)."""

    @abc.abstractmethod
    def is_eog(self, token: int) -> bool: ...

    @abc.abstractmethod
    def decode(self, tokens: Sequence[int], start: int) -> None:
        """Evaluate ``tokens`` at positions ``start..``; keeps the last token's logits."""

    @abc.abstractmethod
    def remove(self, start: int, end: int = -1) -> bool:
        """Drop cells with positions in [start, end) (end -1: to the end). False if unsupported."""

    @abc.abstractmethod
    def shift(self, start: int, end: int, delta: int) -> None:
        """Add ``delta`` to the positions in [start, end) (context shift)."""

    @abc.abstractmethod
    def can_shift(self) -> bool: ...

    @abc.abstractmethod
    def new_sampler(self, params: SamplingParams) -> Any: ...

    @abc.abstractmethod
    def sample(self, sampler: Any) -> int:
        """Sample from the last decoded token's logits (and record it for penalties)."""

    @abc.abstractmethod
    def state_size(self) -> int:
        """Bytes that :meth:`save_state` would return now."""

    @abc.abstractmethod
    def save_state(self) -> Any:
        """The KV state of the sequence (a bytes-like object), to restore with :meth:`load_state`."""

    @abc.abstractmethod
    def load_state(self, data: Any) -> bool: ...

    @abc.abstractmethod
    def clear(self) -> None: ...
