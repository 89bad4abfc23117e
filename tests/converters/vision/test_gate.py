"""The accuracy gate: agreement over samples whose float decision survives invisible noise, and what a failed gate suggests."""

from __future__ import annotations

import numpy as np
import pytest

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


@pytest.mark.parametrize("source, quant, equalize, expected", [
    ("conv", "int8", False, "more or more representative --calib data, --equalize on (evens out activation ranges across "
                           "channels before INT8), or --quant fp16"),
    ("conv", "int8", True, "more or more representative --calib data, or --quant fp16"),  # already on
    ("mlp", "int8", False, "more or more representative --calib data, or --quant fp16"),  # no convolution to equalize
    ("onnx", "int8", False, "more or more representative --calib data, or --quant fp16"),  # needs a PyTorch module
    ("conv", "int4w", False, "more or more representative --calib data, or --quant fp16"),  # not an INT8 recipe
    ("conv", "fp16", False, "more or more representative --calib data"),
])
def test_failed_gate_names_only_the_remedies_that_apply(source: str, quant: str, equalize: bool, expected: str) -> None:
    from pathlib import Path

    from torch import nn

    from converters.vision.pipeline import Options, _remedies
    from converters.vision.recipes import Choice, Quant
    from converters.vision.source import Source, SourceKind

    if source == "onnx":
        src = Source(SourceKind.ONNX, "m", onnx_path=Path("m.onnx"))
    else:
        body = nn.Conv2d(3, 4, 3) if source == "conv" else nn.Linear(3, 4)
        src = Source(SourceKind.TORCH, "m", module=nn.Sequential(body, nn.ReLU()))
    opts = Options(model="m", calib=Path("c"), out=Path("o"), quant=Quant(quant), equalize=equalize)
    assert _remedies(opts, Choice(Quant(quant), "test"), src) == expected
