"""Typed readers for the apps' TOML files (serve.toml, kiosk.toml): each value checked for its type and range,
a wrong one refused in one line naming the key and what is valid."""

from __future__ import annotations

from typing import Any

from runtime.errors import BadInput
from runtime.units import parse_size


def typed(where: str, value: Any, kind: type | tuple[type, ...], valid: str) -> Any:
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise BadInput(f"{where} must be {valid}, got {value!r}")
    if not isinstance(value, kind):
        raise BadInput(f"{where} must be {valid}, got {type(value).__name__} {value!r}"[:300])
    return value


def integer(where: str, value: Any, lo: int, hi: int) -> int:
    typed(where, value, int, f"an integer from {lo} to {hi}")
    if not lo <= value <= hi:
        raise BadInput(f"{where} {value} is out of range: use an integer from {lo} to {hi}")
    return value


def number(where: str, value: Any, lo: float, hi: float) -> float:
    typed(where, value, (int, float), f"a number from {lo} to {hi}")
    if not lo <= value <= hi:  # False for NaN
        raise BadInput(f"{where} {value} is out of range: use a number from {lo} to {hi}")
    return float(value)


def strings(where: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise BadInput(f"{where} must be a list of non-empty strings, got {value!r}"[:300])
    return tuple(value)


def size(where: str, value: Any, minimum: int = 0) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    return parse_size(typed(where, value, str, "a size like 512M"), where, minimum=minimum)


def table(where: str, data: Any, known: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise BadInput(f"{where} must be a table, got {type(data).__name__}")
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise BadInput(f"{where}: unknown key {unknown[0]!r} (valid: {', '.join(known)})")
    return data
