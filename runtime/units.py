"""Byte sizes as people type them (``512M``, ``1.5G``, ``2GiB``) and as we print them."""

from __future__ import annotations

import re

from runtime.errors import BadInput

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str, what: str = "--memory") -> int:
    """``'512M'`` -> 536870912. Suffixes are binary (K=1024); a bare number is bytes."""
    match = _SIZE_RE.match(str(text))
    if not match:
        raise BadInput(f"{what} {text!r} is not a size: use a number with an optional K, M, G or T suffix, e.g. 512M or 1.5G")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value < 1:
        raise BadInput(f"{what} {text!r} must be at least one byte")
    return int(value)


def fmt_bytes(n: float) -> str:
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    return f"{sign}{n:.1f} GiB"  # pragma: no cover
