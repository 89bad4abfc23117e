"""The ``type=`` of every number and text flag of the edgerun commands: one place for their bounds.

A bad value is refused by argparse itself, before anything loads: one line, exit 2,
naming the flag, the value and the valid range. The bounds are what the machine and
the backends take (each has its reason beside it). This module imports nothing heavy,
so light commands (serial-peer) can use it too.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable
from typing import Any

from devices.cpu import GGML_MAX_N_THREADS, max_threads
from runtime.units import shown, size_problem

INT32_MAX = 2**31 - 1  # llama.cpp's counts (n_ctx cells, n_predict, top_k) and LiteRT's tensor dimensions are int32
MAX_BATCH = 65536  # rows per call; LiteRT's dimensions are int32, and no budget holds more rows of any real model
MAX_RUNS = 1_000_000  # timed runs per bench setting


def _integer(text: str, lo: int, hi: int, valid: str) -> int:
    s = text.strip()
    if not re.fullmatch(r"[+-]?[0-9]+", s):
        raise argparse.ArgumentTypeError(f"{shown(text)} is not an integer: use {valid}")
    if len(s.lstrip("+-").lstrip("0")) > 20 or not lo <= int(s) <= hi:  # 20 digits: past any bound, and int() stays cheap
        raise argparse.ArgumentTypeError(f"{shown(text)} is out of range: use {valid}")
    return int(s)


def integer(lo: int, hi: int, why: str = "") -> Callable[[str], int]:
    """An argparse ``type=`` for an integer in [lo, hi]; ``why`` says where the bound comes from."""
    valid = f"an integer from {lo} to {hi}" + (f" ({why})" if why else "")

    def parse(text: str) -> int:
        return _integer(text, lo, hi, valid)

    parse.__name__ = "integer"  # argparse names the type in its own messages
    return parse


def thread_count(text: str) -> int:
    """``--threads``: [1, max_threads()], computed when the flag is parsed."""
    cpus, cap = os.cpu_count() or 1, max_threads()
    return _integer(text, 1, cap, f"an integer from 1 to {cap} (4 x the {cpus} logical CPUs, at most {GGML_MAX_N_THREADS})")


def seconds(hi: float) -> Callable[[str], float]:
    """An argparse ``type=`` for a finite number of seconds in [0, hi]."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{shown(text)} is not a number: use seconds from 0 to {hi:g}") from None
        if not (math.isfinite(value) and 0 <= value <= hi):
            raise argparse.ArgumentTypeError(f"{shown(text)} is out of range: use seconds from 0 to {hi:g}")
        return value

    parse.__name__ = "seconds"
    return parse


def number(lo: float, hi: float, why: str = "") -> Callable[[str], float]:
    """An argparse ``type=`` for a finite number in [lo, hi] (NaN and inf refused: they compare false with every bound)."""
    valid = f"a number from {lo:g} to {hi:g}" + (f" ({why})" if why else "")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{shown(text)} is not a number: use {valid}") from None
        if not (math.isfinite(value) and lo <= value <= hi):
            raise argparse.ArgumentTypeError(f"{shown(text)} is out of range: use {valid}")
        return value

    parse.__name__ = "number"
    return parse


def size(minimum: int = 1) -> Callable[[str], int]:
    """An argparse ``type=`` for a byte size (``512M``, ``1.5G``) in [minimum, 2^48]."""

    def parse(text: str) -> int:
        value, problem = size_problem(text, minimum=minimum)
        if problem:
            raise argparse.ArgumentTypeError(f"{shown(text)} {problem}")
        return value

    parse.__name__ = "size"
    return parse


def sampling_value(key: str) -> Callable[[str], Any]:
    """An argparse ``type=`` for a sampling setting, with the range runtime.llm.sampling holds for it."""
    from runtime.llm.sampling import FLOATS, RULES

    rule = RULES[key]
    kind = "a number" if key in FLOATS else "an integer"

    def parse(text: str) -> Any:
        if key in FLOATS:
            try:
                value: Any = float(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{shown(text)} is not {kind}: use {rule.valid}") from None
        else:
            value = _integer(text, -(2**63), 2**63, rule.valid)  # a cheap, bounded int(); the rule decides the range
        if not rule.in_range(value):  # NaN and inf fail every rule
            raise argparse.ArgumentTypeError(f"{shown(text)} is out of range: use {rule.valid}")
        return value

    parse.__name__ = kind.split()[-1]
    return parse


def utf8_text(text: str) -> str:
    """An argparse ``type=`` for text that goes to a tokenizer, which takes UTF-8."""
    problem = utf8_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"the text {problem}")
    return text


def utf8_problem(text: str) -> str | None:
    """What is wrong with ``text`` as UTF-8, or None.

    Python turns the bytes of argv (and of stdin in the POSIX locale) that are not
    UTF-8 into lone surrogates; they cannot be encoded, so the tokenizer would raise.
    Refused rather than replaced by U+FFFD: the model would silently see other text.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = text[exc.start]
        what = f"byte 0x{ord(char) - 0xDC00:02x}" if 0xDC80 <= ord(char) <= 0xDCFF else f"U+{ord(char):04X}"
        return f"is not valid UTF-8 ({what} at character {exc.start + 1}): give UTF-8 text"
    return None
