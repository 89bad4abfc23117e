"""Byte sizes as people type them (``512M``, ``1.5G``, ``2GiB``) and as we print them."""

from __future__ import annotations

import re
from decimal import Decimal

from runtime.errors import BadInput

# The largest size any budget or cache can name: 2^48 bytes (256 TiB), the user address space of
# x86-64 and AArch64 with 4-level page tables. Nothing larger can be allocated, so it is a typo.
MAX_BYTES = 1 << 48

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(?:i?b)?\s*", re.IGNORECASE)  # ASCII digits only


def shown(text: str, limit: int = 40) -> str:
    """``repr(text)``, cut to ``limit`` characters so a 400-digit typo still fits one line."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"


def size_problem(text: str, *, minimum: int = 1) -> tuple[int, str | None]:
    """``(bytes, None)`` for a valid size in [minimum, MAX_BYTES], else ``(0, what is wrong)``.

    Exact decimal arithmetic: no float rounding, no OverflowError on absurdly long numbers.
    """
    match = _SIZE_RE.fullmatch(str(text))
    valid = f"a size from {fmt_bytes(minimum) if minimum else '0'} to 256 TiB (2^48 bytes)"
    if not match:
        return 0, "is not a size: use a number with an optional K, M, G or T suffix, e.g. 512M or 1.5G, up to 256T"
    value = Decimal(match.group(1)) * _UNITS[match.group(2).lower()]
    if value > MAX_BYTES:
        return 0, f"is too large: use {valid}"
    if value < minimum:
        return 0, f"is too small: use {valid}"
    return int(value), None


def parse_size(text: str, what: str = "--memory", *, minimum: int = 1) -> int:
    """``'512M'`` -> 536870912. Suffixes are binary (K=1024); a bare number is bytes; at most 2^48 bytes."""
    value, problem = size_problem(text, minimum=minimum)
    if problem:
        raise BadInput(f"{what} {shown(str(text))} {problem}")
    return value


def fmt_bytes(n: float) -> str:
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    return f"{sign}{n:.1f} GiB"  # pragma: no cover
