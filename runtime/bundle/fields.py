"""Typed readers for the fields of a bundle manifest (runtime/bundle/manifest.py) and its model-kind sections (runtime/bundle/specs/).

Each takes the parsed JSON object, the key and ``where`` (the manifest path that a message names) and returns
the value checked for its type and range, or raises one BadInput line naming what is wrong and what is valid.
A value of another type is refused, never coerced (bool("false") is True; str() of a list is not a name).
"""

from __future__ import annotations

import enum
import math
import re
from typing import Any

from runtime.errors import BadInput

# A bundle file name, flat: no directories, no '..'. Whole-string pattern: use it with fullmatch only.
FILE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
INT64_MAX = 2**63 - 1  # the largest byte count any file or allocation here can have


def enum_field(cls: type[enum.Enum], value: Any, what: str) -> Any:
    try:
        return cls(value)
    except ValueError:
        valid = ", ".join(m.value for m in cls)  # type: ignore[attr-defined]
        raise BadInput(f"manifest: {what} {value!r:.80} is not valid (valid: {valid})") from None


def required_field(data: dict[str, Any], key: str, typ: type | tuple[type, ...], where: str = "manifest") -> Any:
    if key not in data:
        raise BadInput(f"{where}: required field {key!r} is missing")
    value = data[key]
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        names = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
        raise BadInput(f"{where}: field {key!r} must be {names}, got {type(value).__name__} {value!r}"[:300])
    return value


def count_field(data: dict[str, Any], key: str, where: str, most: int = INT64_MAX) -> int:
    value = data.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= most:
        raise BadInput(f"{where}: {key} {value!r:.80} must be an integer in [0, {most}]")
    return value


def text_field(data: dict[str, Any], key: str, default: str, where: str) -> str:
    """An optional string field: absent gives ``default``; another type is refused, not str()-ed."""
    value = data.get(key, default)
    if not isinstance(value, str):
        raise BadInput(f"{where}: field {key!r} must be str, got {type(value).__name__} {value!r:.80}")
    return value


def flag_field(data: dict[str, Any], key: str, default: bool, where: str) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):  # bool("false") is True: a string is refused, not coerced
        raise BadInput(f"{where}: field {key!r} must be true or false, got {type(value).__name__} {value!r:.80}")
    return value


def object_field(data: dict[str, Any], key: str, where: str = "manifest") -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise BadInput(f"{where}: field {key!r} must be an object, got {type(value).__name__} {value!r:.80}")
    return value


def is_finite(value: Any) -> bool:
    """A number that is a finite float: not a bool, not NaN or +-inf, not an integer past the float range."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def floats_field(data: dict[str, Any], key: str, default: tuple[float, ...], where: str) -> tuple[float, ...]:
    """1 or 3 finite numbers (one for all channels, or one per channel); a single number is one."""
    value = data.get(key, list(default))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or len(value) not in (1, 3) or not all(is_finite(v) for v in value):
        raise BadInput(f"{where}: {key} must be 1 or 3 numbers, all finite, got {value!r:.80}")
    return tuple(float(v) for v in value)
