"""Keep llama.cpp's own output off the user's terminal while the converter drives it.

llama.cpp writes notes (per-tensor quantization lines, fallback types, cache
sizes) to fd 2 directly and through llama-cpp-python's log callback, which
prints to ``sys.stderr`` and re-enables itself whenever a ``Llama`` is built.
Inside :func:`native_output_to_log` both go to a temporary file whose lines are
logged at DEBUG afterwards (``edgerun -v`` plus a DEBUG logger shows them). The
context yields a stream on the real stderr for the progress bars; a caller
that needs llama.cpp's words (the reason a load failed) passes ``lines``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import TextIO

log = logging.getLogger(__name__)


def _is_fd2(stream: TextIO) -> bool:
    try:
        return stream.fileno() == 2
    except (AttributeError, OSError, io.UnsupportedOperation):
        return False


@contextlib.contextmanager
def native_output_to_log(lines: list[str] | None = None) -> Iterator[TextIO]:
    original = sys.stderr
    original.flush()
    saved = os.dup(2)
    terminal = os.fdopen(os.dup(saved), "w") if _is_fd2(original) else None
    with tempfile.TemporaryFile() as captured:
        sink = io.TextIOWrapper(os.fdopen(os.dup(captured.fileno()), "wb"), encoding="utf-8", errors="replace",
                                line_buffering=True)
        os.dup2(captured.fileno(), 2)
        sys.stderr = sink
        try:
            yield terminal or original
        finally:
            sink.flush()
            sys.stderr = original
            os.dup2(saved, 2)
            os.close(saved)
            sink.close()
            if terminal is not None:
                terminal.close()
            captured.seek(0)
            for line in captured.read().decode("utf-8", "replace").splitlines():
                if line.strip():
                    log.debug("llama.cpp: %s", line.strip())
                    if lines is not None:
                        lines.append(line.strip())
