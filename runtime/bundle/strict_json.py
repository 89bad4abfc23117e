"""Manifest JSON, read strictly: what parsed must be something every later step can take.

UTF-8, finite numbers only, integers of at most 20 digits, at most 32 levels deep, every string and key
encodable text. Each refusal is one BadInput line; also used for the store's own small JSON files.
"""

from __future__ import annotations

import json
import math
from typing import Any

from runtime.errors import BadInput

MAX_JSON_DEPTH = 32  # objects and arrays inside each other; an honest manifest nests 4 deep
MAX_INT_DIGITS = 20  # 2^64 - 1 has 20 digits; no manifest integer is larger


def _json_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:  # int() itself refuses 4,300 digits with a ValueError, and is slow before that
        raise BadInput(f"an integer of {digits} digits is out of range (at most {MAX_INT_DIGITS} digits)")
    return int(text)


def _json_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses to inf
        raise BadInput(f"the number {text:.40} is out of the float range")
    return value


def _json_constant(name: str) -> float:
    raise BadInput(f"{name} is not a number a manifest may hold (use a finite number)")


def _json_path(path: tuple | None) -> str:
    """``files[0].role`` from the (parent, key) chain the walk keeps; keys shown escaped, the whole kept short."""
    parts: list[str] = []
    while path is not None:
        path, key = path
        parts.append(f"[{key}]" if isinstance(key, int) else "." + key.encode("utf-8", "backslashreplace").decode())
    text = "".join(reversed(parts)).lstrip(".") or "(top level)"
    return text if len(text) <= 100 else text[:97] + "..."


def _walk(data: Any, where: str) -> None:
    """Refuses what parsed but no later step can take, walking every value and key without recursion:

    * nesting deeper than MAX_JSON_DEPTH (a later recursive walk, to_json or asdict, would run out of stack);
    * a string that is not Unicode text: JSON's ``\\ud800`` escape parses to a lone surrogate, which every
      UTF-8 encode after it (a terminal, ``edgerun list``, a chat template handed to llama.cpp) fails on.
    """
    stack: list[tuple[Any, int, tuple | None]] = [(data, 1, None)]
    while stack:
        value, depth, path = stack.pop()
        if isinstance(value, str):
            _check_text(value, path, where, "string")
        elif isinstance(value, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                raise BadInput(f"{where}: manifest.json nests objects or arrays more than {MAX_JSON_DEPTH} levels deep")
            for key, item in value.items() if isinstance(value, dict) else enumerate(value):
                if isinstance(key, str):
                    _check_text(key, (path, key), where, "key")
                stack.append((item, depth + 1, (path, key)))


def _check_text(text: str, path: tuple | None, where: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadInput(f"{where}: manifest.json: the {what} at {_json_path(path)} is not text: it holds a lone"
                       f" surrogate {text[exc.start]!a} (half of a \\u escape pair); write the character as UTF-8"
                       " or as a whole surrogate pair") from None


def parse_json(raw: bytes, where: str) -> Any:
    """Manifest JSON: UTF-8, finite numbers only, integers of at most 20 digits, at most 32 levels deep,
    every string and key encodable text (no lone surrogates).

    Every refusal is one BadInput line; nothing past these bounds reaches the fields' own checks,
    and no later walk over the data (to_json, asdict) can run out of stack or fail to encode.
    """
    try:
        data = json.loads(raw.decode("utf-8"), parse_int=_json_int, parse_float=_json_float, parse_constant=_json_constant)
    except RecursionError:  # deeper than the interpreter's stack
        raise BadInput(f"{where}: manifest.json nests objects or arrays more than {MAX_JSON_DEPTH} levels deep") from None
    except BadInput as exc:
        raise BadInput(f"{where}: manifest.json: {exc}") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise BadInput(f"{where}: manifest.json is not valid JSON ({exc})") from None
    _walk(data, where)  # shallow enough to parse, yet too deep or not text for what comes after
    return data
