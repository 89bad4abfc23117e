"""Errors that reach the user as one line and a meaningful exit code.

Every error raised on purpose by edgerun derives from :class:`EdgerunError`.
The CLI prints ``edgerun: <message>`` on stderr and exits with ``exit_code``;
nothing else (no traceback) reaches the terminal for these.
"""

from __future__ import annotations

import importlib
import re
from types import ModuleType


class EdgerunError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with."""

    exit_code = 1


class BadInput(EdgerunError):
    """The user gave something invalid: a path, a name, a file, a flag value."""

    exit_code = 2


class DoesNotFit(EdgerunError):
    """The plan does not fit the memory budget; nothing was allocated."""

    exit_code = 3


class MissingDependency(EdgerunError):
    """An optional package is not installed; the message carries the pip line."""

    exit_code = 4


class PlacementError(EdgerunError):
    """The requested target cannot be honoured under the given policy."""

    exit_code = 5


class BackendError(EdgerunError):
    """The native backend failed after our checks passed."""

    exit_code = 6


class QualityGateFailed(EdgerunError):
    """A conversion's quality gate refused the quantized model (llm, vision, audio); nothing was written."""

    exit_code = 7


class QueueFull(EdgerunError):
    """A bounded queue refused work at once (never blocks); ``retry_after`` is the seconds to wait before trying
    again, estimated from the recent service rate (HTTP: 429 with ``Retry-After``)."""

    exit_code = 8

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class DeadlineExceeded(EdgerunError):
    """A request's deadline passed before its work finished; it was taken out of the queue or its slot (HTTP: 504)."""

    exit_code = 9


class Cancelled(EdgerunError):
    """A request was cancelled (by its caller, a client that went away, or a shutdown) before its work finished."""

    exit_code = 10


def not_installed(module: str, pip_line: str, *, purpose: str = "", cause: str | None = None) -> MissingDependency:
    """The error for an optional package that is not installed: the one wording of it (what needs ``module``,
    the package actually absent when ``module`` imports another one, ``cause``, and the ``pip_line``)."""
    who = f"{purpose} needs {module!r}, which is" if purpose else f"the Python package {module!r} is"
    also = f" (it imports {cause!r}, which is missing)" if cause else ""
    return MissingDependency(f"{who} not installed{also}; install it with: {pip_line}")


def missing(module: str, extra: str) -> MissingDependency:
    """The error for an optional package that edgerun's extra ``extra`` installs (``pip install 'edgerun[extra]'``)."""
    return not_installed(module, f"pip install 'edgerun[{extra}]'")


def require(module: str, pip_line: str, *, purpose: str = "") -> ModuleType:
    """Import ``module`` (dotted names too), or raise MissingDependency naming it and ``pip_line``
    (:func:`not_installed`'s wording).

    ``purpose`` says what needs it ("the ONNX route"); the message names the package that is
    actually missing when it is one that ``module`` itself imports.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        top = module.partition(".")[0]
        cause = exc.name if exc.name and exc.name.partition(".")[0] != top else None
        raise not_installed(module, pip_line, purpose=purpose, cause=cause) from None


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def one_line(what: BaseException | str, limit: int | None = 400, *, escape: bool = False) -> str:
    """An exception's message (native runtimes' and Jinja's span several), or a text, on one line: its words
    joined by single spaces; an exception's type's name when it has no message. ``escape``: the control
    characters left (an escape sequence in a name) written as ``\\x1b``, so a terminal shows them harmlessly.
    At most ``limit`` characters (None: no limit), cut with "..."."""
    text = " ".join(str(what).split())
    if not text and isinstance(what, BaseException):
        text = type(what).__name__
    if escape:
        text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."
