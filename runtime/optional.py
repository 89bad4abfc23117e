"""Optional packages: import one, or refuse in one line that says how to install it."""

from __future__ import annotations

import importlib
from types import ModuleType

from runtime.errors import MissingDependency


def require(module: str, pip_line: str, *, purpose: str = "") -> ModuleType:
    """Import ``module`` (dotted names too), or raise MissingDependency naming it and ``pip_line``.

    ``purpose`` says what needs it ("the ONNX route"); the message names the package that is
    actually missing when it is one that ``module`` itself imports.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        who = f"{purpose} needs" if purpose else "this needs"
        top = module.partition(".")[0]
        also = f" (it imports {exc.name!r}, which is missing)" if exc.name and exc.name.partition(".")[0] != top else ""
        raise MissingDependency(f"{who} {module!r}, which is not installed{also}; install it with: {pip_line}") from None
