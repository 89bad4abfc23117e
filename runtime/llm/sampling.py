"""Sampling settings: one typed place, validated at the edge.

Every value is checked for its type and its range where it enters: a CLI flag
(errors name the ``--flag``) or a manifest's ``llm.sampling`` defaults (errors
name the JSON path, e.g. ``manifest llm.sampling.top_k``). Numbers are bounded to
what llama.cpp takes: 32-bit integers, a 32-bit unsigned seed, finite C floats.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from runtime.errors import BadInput
from runtime.llm.grammar import Grammar

INT32_MAX = 2**31 - 1  # llama.cpp's top_k and token counts are int32_t
SEED_MAX = 2**32 - 2  # llama.cpp's seed is a uint32_t; 2^32 - 1 (LLAMA_DEFAULT_SEED) means "random" to it
FLOAT_MAX = 3.4028234663852886e38  # llama.cpp's sampling settings are C floats; larger values become inf
# Stop strings: a stream holds back the last len(longest stop) - 1 characters (a stop may arrive split across
# tokens), and every new piece of text is searched for every stop. 256 characters keeps that hold-back under a
# short paragraph (a 4 MB stop held back the whole answer) and 16 strings cover a template's end markers plus a
# caller's own (OpenAI's API takes 4; real stops are markers like "<|im_end|>" or "\nUser:", a few characters).
MAX_STOPS = 16
MAX_STOP_CHARS = 256
MAX_TOP_LOGPROBS = 20  # alternatives reported per token (OpenAI's limit)
MAX_LOGIT_BIAS = 1024  # tokens one request may bias
LOGIT_BIAS = 100.0  # a bias is in [-100, 100] (OpenAI's range; -100 bans a token, 100 all but forces it)
REQUEST_ONLY = ("grammar", "logit_bias", "top_logprobs")  # settings of one request, never a manifest default


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is not the integer 1


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_strings(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(s, str) for s in value)


@dataclass(frozen=True)
class _Rule:
    typed: Callable[[Any], bool]  # the type check, run first: a range check never sees a wrong type
    in_range: Callable[[Any], bool]  # comparisons are False for NaN, so NaN never passes
    valid: str  # what is valid, for the error


RULES: dict[str, _Rule] = {
    "max_tokens": _Rule(_is_int, lambda v: 1 <= v <= INT32_MAX, f"an integer in [1, {INT32_MAX}]"),
    "temperature": _Rule(_is_number, lambda v: 0 <= v <= FLOAT_MAX, "a finite number >= 0 (0 is greedy)"),
    "top_k": _Rule(_is_int, lambda v: 0 <= v <= INT32_MAX, f"an integer in [0, {INT32_MAX}] (0 disables)"),
    "top_p": _Rule(_is_number, lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "min_p": _Rule(_is_number, lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "repeat_penalty": _Rule(_is_number, lambda v: 0 < v <= FLOAT_MAX, "a finite number > 0 (1 disables)"),
    "seed": _Rule(lambda v: v is None or _is_int(v), lambda v: v is None or 0 <= v <= SEED_MAX,
                  "an integer in [0, 2^32 - 2]"),
    "stop": _Rule(_is_strings, lambda v: len(v) <= MAX_STOPS and all(0 < len(s) <= MAX_STOP_CHARS for s in v),
                  f"a list of non-empty strings (at most {MAX_STOPS}, each at most {MAX_STOP_CHARS} characters)"),
}
FLOATS = ("temperature", "top_p", "min_p", "repeat_penalty")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check(key: str, value: Any, label: str) -> Any:
    """``value`` for setting ``key``, normalized (numbers as floats, ``stop`` as a tuple).

    Raises BadInput naming ``label`` (a ``--flag`` or a manifest path) and what is valid.
    """
    rule = RULES[key]
    if not rule.typed(value):
        raise BadInput(f"{label} must be {rule.valid}, got {type(value).__name__} {_shown(value)}")
    if not rule.in_range(value):
        raise BadInput(f"{label} {_shown(value)} is not valid: use {rule.valid}")
    if key in FLOATS:
        return float(value)
    return tuple(value) if key == "stop" else value


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token. ``temperature == 0`` is greedy (top-k/p ignored).

    ``seed`` None (the default) means: draw a fresh seed for each request, so
    unseeded sampled answers differ; the runtime reports the seed it drew so a
    run can be reproduced with ``--seed``.
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 40  # 0 disables
    top_p: float = 0.95  # 1.0 disables
    min_p: float = 0.05  # 0.0 disables
    repeat_penalty: float = 1.0  # 1.0 disables; over the last 64 tokens
    seed: int | None = None  # None: a fresh seed per request
    stop: tuple[str, ...] = field(default_factory=tuple)
    grammar: Grammar | None = None  # constrained decoding (runtime.llm.grammar); never a manifest default
    # (token id, bias) pairs added to the logits before sampling; ids are checked against the vocabulary at admission
    logit_bias: tuple[tuple[int, float], ...] = ()
    # report each generated token's log probability and this many alternatives (None: report none); they are the
    # model's own distribution (the log-softmax of its logits, before bias, penalties, temperature and grammar)
    top_logprobs: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name in RULES:
                object.__setattr__(self, f.name, check(f.name, getattr(self, f.name), _flag(f.name)))
        if self.grammar is not None and not isinstance(self.grammar, Grammar):
            raise BadInput(f"grammar must be a runtime.llm.grammar.Grammar, got {type(self.grammar).__name__}")
        bias = self.logit_bias
        if not isinstance(bias, tuple) or len(bias) > MAX_LOGIT_BIAS or not all(
                isinstance(p, tuple) and len(p) == 2 and _is_int(p[0]) and p[0] >= 0 and _is_number(p[1])
                and -LOGIT_BIAS <= p[1] <= LOGIT_BIAS for p in bias):
            raise BadInput(f"logit_bias must be at most {MAX_LOGIT_BIAS} (token id, bias) pairs, each bias in "
                           f"[-{LOGIT_BIAS:g}, {LOGIT_BIAS:g}]")
        n = self.top_logprobs
        if n is not None and (not _is_int(n) or not 0 <= n <= MAX_TOP_LOGPROBS):
            raise BadInput(f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {_shown(n)}")

    @classmethod
    def check_defaults(cls, defaults: Any, where: str) -> dict[str, Any]:
        """A manifest's sampling defaults, checked key by key; errors name ``{where}.{key}``."""
        if not isinstance(defaults, dict):
            raise BadInput(f"{where} must be an object of settings ({', '.join(RULES)}), got {type(defaults).__name__}")
        for key in defaults:
            if key not in RULES:
                raise BadInput(f"{where}: unknown setting {_shown(key)} (valid: {', '.join(RULES)})")
        return {key: check(key, value, f"{where}.{key}") for key, value in defaults.items()}

    @classmethod
    def from_defaults(cls, defaults: dict[str, Any], *, where: str = "manifest llm.sampling",
                      **overrides: Any) -> SamplingParams:
        """Manifest defaults (checked, errors name ``where``), then explicit overrides (None means 'not given')."""
        base = cls.check_defaults(defaults, where)
        unknown = sorted(set(overrides) - RULES.keys() - set(REQUEST_ONLY))
        if unknown:
            raise TypeError(f"unknown sampling settings {unknown} (valid: {', '.join([*RULES, *REQUEST_ONLY])})")
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)

    def with_(self, **changes: Any) -> SamplingParams:
        return replace(self, **changes)
