"""Measurements: resident memory now and at peak, and the one percentile every report uses.

:func:`percentile` is the only place edgerun computes a percentile (tests/test_one_implementation.py keeps it so):
each caller names its method, so two reports of "p95" never differ by a silent choice of definition.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Sequence
from enum import Enum

import numpy as np

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")  # pragma: no cover - Linux always has it


def peak_rss_bytes() -> int:
    """Peak resident set size of this process image (VmHWM).

    Not ``getrusage().ru_maxrss``: Linux carries that across ``execve``, so a
    child started from a big parent (a test runner with models loaded) would
    report the parent's peak instead of its own.
    """
    return _status_kib("VmHWM:") * 1024


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * _PAGE


class PercentileMethod(str, Enum):
    """How :func:`percentile` picks its value."""

    # numpy's default: interpolates between the two values around rank q/100 x (n - 1); for dashboards and
    # benchmarks, where a smooth estimate of the distribution is wanted
    LINEAR = "linear"
    # the smallest value with at least q % of the values at or below it: a value that occurred, for decisions
    # on it (a canary's p95 against a margin) and reports of what a user waited
    NEAREST_RANK = "nearest-rank"


def percentile(values: Sequence[float] | np.ndarray, q: float, *, method: PercentileMethod | str) -> float:
    """The ``q``-th percentile (0-100) of ``values`` (a sequence or 1-D array of numbers) by ``method``.

    The method is named by every caller on purpose (no default): the two give different numbers on the same
    data. LINEAR is ``numpy.percentile(values, q)`` exactly (its dtype's arithmetic); NEAREST_RANK is
    ``sorted(values)[ceil(q / 100 * n) - 1]`` (the first value for q = 0). ValueError for no values, a ``q``
    outside 0..100 or an unknown method, naming the valid ones."""
    try:
        how = PercentileMethod(method)
    except ValueError:
        raise ValueError(f"percentile method {method!r} is not valid; valid: "
                         f"{', '.join(m.value for m in PercentileMethod)}") from None
    if isinstance(q, bool) or not isinstance(q, numbers.Real) or not 0 <= q <= 100:
        raise ValueError(f"percentile {q!r} is not valid; give a number from 0 to 100")
    if len(values) == 0:
        raise ValueError("percentile of no values")
    if how is PercentileMethod.LINEAR:
        return float(np.percentile(values, q))
    ordered = sorted(values)
    return float(ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)])
