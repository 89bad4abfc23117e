"""The quality arithmetic against hand-computed values, and the gate defaults."""

from __future__ import annotations

import math

import numpy as np
import pytest

from converters.llm.options import Quant
from converters.llm.quality import score_window
from runtime.errors import BadInput


def test_identical_logits_have_zero_kl_and_full_agreement() -> None:
    logits = np.random.default_rng(0).normal(size=(40, 50)).astype(np.float32)  # > ROW_BLOCK rows
    targets = np.arange(40) % 50
    nll_r, nll_t, kl, same = score_window(logits, logits, targets)
    assert np.all(kl == 0) and same.all() and np.array_equal(nll_r, nll_t)


def test_two_token_distributions_by_hand() -> None:
    # ref P = (0.5, 0.5), test P = (0.9, 0.1); KL = 0.5 ln(0.5/0.9) + 0.5 ln(0.5/0.1).
    ref = np.array([[0.0, 0.0]], np.float32)
    test = np.array([[math.log(0.9), math.log(0.1)]], np.float32)
    nll_r, nll_t, kl, _ = score_window(ref, test, np.array([1]))
    assert kl[0] == pytest.approx(0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1), rel=1e-6)
    assert nll_r[0] == pytest.approx(math.log(2)) and nll_t[0] == pytest.approx(-math.log(0.1), rel=1e-6)



@pytest.mark.parametrize("ref_logits,agree", [
    ([0.0, 1.0], False),  # ref prefers token 1, test prefers token 0
    ([1.0, 0.0], True),  # both prefer token 0
])
def test_top1_agreement(ref_logits, agree) -> None:
    test = np.array([[math.log(0.9), math.log(0.1)]], np.float32)
    assert score_window(np.array([ref_logits], np.float32), test, np.array([0]))[3][0] == agree


@pytest.mark.parametrize("quant", list(Quant))
def test_gate_defaults_are_ordered_by_precision(quant) -> None:
    # A coarser type must never get a tighter default gate than a finer one.
    order = [Quant.F32, Quant.F16, Quant.Q8_0, Quant.Q4_K_M, Quant.Q4_0]
    finer = order[: order.index(quant)]
    assert all(q.default_max_kl <= quant.default_max_kl for q in finer)


def test_unknown_quant_lists_valid_ones() -> None:
    with pytest.raises(BadInput, match="valid: f32, f16, q8_0, q4_0, q4_k_m"):
        Quant.parse("q2_k")
