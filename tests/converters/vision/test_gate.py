"""The gate's agreement over samples whose float decision survives invisible noise."""

from __future__ import annotations

import numpy as np

from converters.vision.gate import agreement_where_stable


def test_agreement_counts_only_samples_the_noise_leaves_alone() -> None:
    # four samples, three classes. Sample 1 flips under noise (a decision boundary); sample 3 is stable
    # and the quantized model disagrees on it; samples 0 and 2 are stable and agree.
    ref = np.array([[3.0, 0, 0], [1.0, 0.9, 0], [0, 0, 2.0], [0, 5.0, 0]])
    noisy = np.array([[2.9, 0, 0], [0.9, 1.0, 0], [0, 0, 2.1], [0, 4.9, 0]])
    test = np.array([[3.0, 0, 0], [0.0, 1.0, 0], [0, 0, 1.0], [6.0, 0, 0]])
    agree, n = agreement_where_stable(ref, noisy, test)
    assert n == 3 and agree == 2 / 3  # sample 1's disagreement does not count; sample 3's does


def test_no_stable_sample_gives_none() -> None:
    ref = np.array([[1.0, 0.0]])
    assert agreement_where_stable(ref, ref[:, ::-1], ref) == (None, 0)


def test_a_detector_score_is_judged_by_its_decision() -> None:
    # one output column: the decision is score >= 0.5
    ref, noisy, test = np.array([[0.9], [0.51], [0.2]]), np.array([[0.88], [0.49], [0.21]]), np.array([[0.7], [0.8], [0.6]])
    assert agreement_where_stable(ref, noisy, test) == (0.5, 2)
