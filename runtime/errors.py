"""Errors that reach the user as one line and a meaningful exit code.

Every error raised on purpose by edgerun derives from :class:`EdgerunError`.
The CLI prints ``edgerun: <message>`` on stderr and exits with ``exit_code``;
nothing else (no traceback) reaches the terminal for these.
"""

from __future__ import annotations


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


def missing(module: str, extra: str) -> MissingDependency:
    """The error for an optional package that is not installed."""
    return MissingDependency(
        f"the Python package {module!r} is not installed; install it with: pip install 'edgerun[{extra}]'"
    )


def one_line(exc: BaseException, limit: int = 400) -> str:
    """An exception's message on one line (native runtimes' and Jinja's span several), at most ``limit`` characters;
    its type's name when it has no message."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
