"""runtime.metrics.percentile: numpy's linear method exactly, the nearest rank as the callers had it, strict inputs."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from runtime.metrics import PercentileMethod, percentile

LINEAR, NEAREST = PercentileMethod.LINEAR, PercentileMethod.NEAREST_RANK


def _old_nearest(values: list[float], q: float) -> float:
    """apps/voice/timing.py's percentile before it moved here (the canary's p95 was the same with q = 95)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@pytest.mark.parametrize("seed", range(20))
def test_linear_is_numpys_and_nearest_is_the_old_rank_to_the_bit(seed: int) -> None:
    # The callers' numbers must not move: the kiosk, the load test and `edgerun bench` used numpy.percentile,
    # the voice summary and the canary the nearest rank.
    rng = random.Random(seed)
    values = [rng.lognormvariate(0, 1) * 1000 for _ in range(rng.randint(1, 300))]
    for q in (0, 1, 50, 95, 99, 99.9, 100, rng.uniform(0, 100)):
        assert percentile(values, q, method=LINEAR) == float(np.percentile(values, q))
        assert percentile(np.asarray(values), q, method="linear") == float(np.percentile(np.asarray(values), q))
        assert percentile(values, q, method=NEAREST) == _old_nearest(values, q)
    old_p95 = sorted(values)[max(0, math.ceil(0.95 * len(values)) - 1)]
    assert percentile(values, 95, method=NEAREST) == old_p95


def test_nearest_rank_is_a_value_that_occurred() -> None:
    assert percentile([float(i) for i in range(1, 101)], 95, method=NEAREST) == 95.0
    assert percentile([3.0], 95, method=NEAREST) == 3.0
    # 19 of 20 at 1.0 is exactly 95 %: the p95 is 1.0; one more slow value makes it the slow one
    assert percentile([1.0] * 19 + [10.0], 95, method=NEAREST) == 1.0
    assert percentile([1.0] * 18 + [10.0] * 2, 95, method=NEAREST) == 10.0
    assert percentile([5.0, 1.0, 3.0], 0, method=NEAREST) == 1.0  # q = 0: the smallest, not an index of -1
    assert percentile([1.0, 2.0], 50, method=LINEAR) == 1.5 and percentile([1.0, 2.0], 50, method=NEAREST) == 1.0


@pytest.mark.parametrize("values, q, method, message", [
    ([], 50, LINEAR, "percentile of no values"),
    (np.array([]), 50, NEAREST, "percentile of no values"),
    ([1.0], -1, LINEAR, "percentile -1 is not valid; give a number from 0 to 100"),
    ([1.0], 100.5, NEAREST, "percentile 100.5 is not valid"),
    ([1.0], float("nan"), LINEAR, "percentile nan is not valid"),
    ([1.0], True, LINEAR, "percentile True is not valid"),  # a flag passed where q was meant
    ([1.0], 50, "median", "percentile method 'median' is not valid; valid: linear, nearest-rank"),
])
def test_bad_arguments_are_refused_naming_them(values, q, method, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        percentile(values, q, method=method)


def test_the_method_has_no_default() -> None:
    # every caller names it: the two methods give different numbers on the same data
    with pytest.raises(TypeError):
        percentile([1.0, 2.0], 50)  # type: ignore[call-arg]
