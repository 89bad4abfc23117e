"""Sampling settings: one typed place, validated at the edge."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from runtime.errors import BadInput


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token. ``temperature == 0`` is greedy (top-k/p ignored)."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 40  # 0 disables
    top_p: float = 0.95  # 1.0 disables
    min_p: float = 0.05  # 0.0 disables
    repeat_penalty: float = 1.0  # 1.0 disables; over the last 64 tokens
    seed: int = 0
    stop: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        checks = [
            (self.max_tokens >= 1, "--max-tokens", self.max_tokens, "an integer >= 1"),
            (self.temperature >= 0, "--temperature", self.temperature, "a number >= 0 (0 is greedy)"),
            (self.top_k >= 0, "--top-k", self.top_k, "an integer >= 0 (0 disables)"),
            (0 < self.top_p <= 1, "--top-p", self.top_p, "a number in (0, 1]"),
            (0 <= self.min_p < 1, "--min-p", self.min_p, "a number in [0, 1)"),
            (self.repeat_penalty > 0, "--repeat-penalty", self.repeat_penalty, "a number > 0 (1 disables)"),
            (0 <= self.seed < 2**32 - 1, "--seed", self.seed, "an integer in [0, 2^32 - 2]"),
        ]
        for ok, flag, value, valid in checks:
            if not ok:
                raise BadInput(f"{flag} {value!r} is not valid: use {valid}")
        if any(not s for s in self.stop):
            raise BadInput("--stop '' is not valid: a stop string must not be empty")

    @classmethod
    def from_defaults(cls, defaults: dict[str, Any], **overrides: Any) -> SamplingParams:
        """Manifest defaults, then explicit overrides (None means 'not given')."""
        names = {f.name for f in fields(cls)}
        base = {k: v for k, v in defaults.items() if k in names}
        base.update({k: v for k, v in overrides.items() if v is not None and k in names})
        if "stop" in base:
            base["stop"] = tuple(base["stop"])
        return cls(**base)

    def with_(self, **changes: Any) -> SamplingParams:
        return replace(self, **changes)
