"""Optional packages: import one, or refuse in one line that says how to install it."""

from __future__ import annotations

import importlib
from types import ModuleType

from runtime.errors import not_installed


def require(module: str, pip_line: str, *, purpose: str = "") -> ModuleType:
    """Import ``module`` (dotted names too), or raise MissingDependency naming it and ``pip_line``
    (:func:`runtime.errors.not_installed`'s wording).

    ``purpose`` says what needs it ("the ONNX route"); the message names the package that is
    actually missing when it is one that ``module`` itself imports.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = module.partition(".")[0]
        cause = exc.name if exc.name and exc.name.partition(".")[0] != top else None
        raise not_installed(module, pip_line, purpose=purpose, cause=cause) from None
