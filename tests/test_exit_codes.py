"""The CLI's docstring (what ``edgerun --help`` readers and scripts are told) names every exit code an error has."""

from __future__ import annotations

import re

import apps.cli
from runtime import errors


def _defined_codes() -> dict[int, str]:
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.EdgerunError)]
    return {c.exit_code: c.__name__ for c in classes}


def test_the_cli_docstring_names_every_exit_code_of_runtime_errors() -> None:
    codes = _defined_codes()
    assert {1, 2, 8, 9, 10} <= set(codes), codes  # the reader found the classes
    listing = (apps.cli.__doc__ or "").split("Exit codes", 1)[-1]
    named = {int(n) for n in re.findall(r"(?<![\w.])(\d+) [a-z]", listing)}
    missing = {code: name for code, name in codes.items() if code not in named}
    assert not missing, f"apps/cli/__init__.py's docstring does not name exit codes {missing}"
    assert len(codes) == len({c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.EdgerunError)}), \
        "two error classes share an exit code"
