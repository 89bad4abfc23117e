"""Text from files and models, made safe to print on a terminal.

A manifest, a GGUF or a report is written by whoever made the file. Printed
raw, an ANSI escape in a license string could rewrite the screen, a carriage
return could hide what came before it, and a bidi override could reorder it.
"""

from __future__ import annotations

import unicodedata

# Control (C0, DEL, C1), format (bidi overrides, zero-width), surrogate, private-use and
# unassigned characters, and the Unicode line and paragraph separators.
ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def printable(value: object) -> str:
    """``str(value)`` with every character in :data:`ESCAPED_CATEGORIES` written as a Python escape (``\\x1b``, ``\\u202e``)."""
    text = str(value)
    if text.isascii() and text.isprintable():  # the common case: nothing to escape
        return text
    return "".join(
        ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch) in ESCAPED_CATEGORIES else ch
        for ch in text
    )
