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

    from converters.vision.front import remedies
    from converters.vision.recipes import Choice, QuantScheme
    from converters.vision.source import Source, SourceKind

    if source == "onnx":
        src = Source(SourceKind.ONNX, "m", onnx_path=Path("m.onnx"))
    else:
        body = nn.Conv2d(3, 4, 3) if source == "conv" else nn.Linear(3, 4)
        src = Source(SourceKind.TORCH, "m", module=nn.Sequential(body, nn.ReLU()))
    assert remedies(Choice(QuantScheme(quant), "test"), src, equalized=equalize) == expected


def _report(top1: float, stable: float | None, top5: float, acc: tuple[float, float] | None = None,
            min_agreement: float | None = None, samples: int = 200):
    from converters.vision.gate import GateReport

    return GateReport(samples=samples, top1_agreement=top1, top5_agreement=top5, cosine_min=0.9, cosine_mean=0.99,
                      max_abs_error=1.0, labelled=50 if acc else 0, accuracy_float=acc[0] if acc else None,
                      accuracy_quant=acc[1] if acc else None, min_agreement=min_agreement, float_bytes=4, quant_bytes=1,
                      float_latency_ms=10.0, quant_latency_ms=5.0, cpu="test cpu", float_self_agreement=0.9,
                      top1_agreement_stable=stable, stable_samples=None if stable is None else samples * 9 // 10)


# (name, report arguments, passes the default gate, the check that fails). The good rows are the shipped
# conversions' own figures on bench/vision.py's 200 images (README); the broken rows are measured broken ones.
DEFAULT_CASES = [
    ("mobilenet-v2 onnx gptq", dict(top1=0.785, stable=0.786, top5=0.985), True, None),
    ("mobilenet-v2 tflite gptq", dict(top1=0.80, stable=0.801, top5=0.995), True, None),
    ("efficientnet-lite0 tflite gptq", dict(top1=0.935, stable=0.972, top5=1.0), True, None),
    ("efficientnet-lite0 onnx gptq", dict(top1=0.915, stable=0.966, top5=1.0), True, None),
    # ORT's saturating U8S8 kernels on a CPU without VNNI: 65.5 % over all 200, so at most 131 of the 196 stable
    # samples; refused on top-1 alone, even granting it every top-5 hit
    ("mobilenet-v2 onnx saturated", dict(top1=0.655, stable=131 / 196, top5=1.0), False, "top-1 agreement"),
    # calibrated on inputs at half their real range: every activation range too narrow
    ("mobilenet-v2 onnx half-range calibration", dict(top1=0.445, stable=0.444, top5=0.855), False, ("top-1 agreement", "top-5 agreement")),
    # a decent top-1 agreement but the float answer falls out of the five best too often: damaged outputs
    ("top-5 lost", dict(top1=0.9, stable=0.9, top5=0.9), False, "top-5 agreement"),
    # no noise measured (audio) or no stable sample: top-1 agreement over all samples decides
    ("no noise floor", dict(top1=0.6, stable=None, top5=1.0), False, "top-1 agreement"),
    # labels say the quantized model is right 10 points less often than float
    ("accuracy lost", dict(top1=0.95, stable=0.95, top5=1.0, acc=(0.8, 0.7)), False, "accuracy drop"),
    ("accuracy kept", dict(top1=0.95, stable=0.95, top5=1.0, acc=(0.8, 0.79)), True, None),
]


def test_small_labelled_sets_may_lose_one_sample_and_few_classes_skip_top5() -> None:
    # 50 labelled: one sample is 2 points, under the 3-point bound; on 20 labelled it is 5 points, and allowed
    report = _report(top1=0.95, stable=0.95, top5=1.0, acc=(0.8, 0.78))
    assert report.passed
    from dataclasses import replace

    assert replace(report, labelled=20, accuracy_quant=0.75).passed and not replace(report, labelled=20, accuracy_quant=0.7).passed
    # a 5-class model: top-5 says nothing top-1 does not, so it is not a check
    assert [c.name for c in replace(report, classes=5).checks] == ["top-1 agreement", "accuracy drop"]
    assert "top-5 agreement" in [c.name for c in replace(report, classes=1000).checks]


def test_a_detector_is_judged_on_its_decisions_over_every_sample() -> None:
    # the wake-word head calibrated on silence agreed on 95.3 % of its windows: chance agreement of a yes/no
    # decision is high, so a detector keeps the strict bar over all samples, and no top-5
    from dataclasses import replace

    broken = replace(_report(top1=0.953, stable=None, top5=0.953), classes=1)
    assert [(c.name, c.passed) for c in broken.checks] == [("decision agreement", False)] and not broken.passed
    assert replace(broken, top1_agreement=0.995).passed


@pytest.mark.parametrize("name, kwargs, passes, failing", DEFAULT_CASES, ids=[c[0] for c in DEFAULT_CASES])
def test_default_gate_separates_good_from_broken(name: str, kwargs: dict, passes: bool, failing: str | tuple | None) -> None:
    report = _report(**kwargs)
    assert report.passed is passes and report.default_passed is passes
    expected = [] if failing is None else [failing] if isinstance(failing, str) else list(failing)
    assert [c.name for c in report.checks if not c.passed] == expected
    data = report.to_dict()
    assert data["gate"]["criterion"] == "default" and data["gate"]["min_agreement_passed"] is None
    assert data["passed"] is passes and ("FAILED" in report.verdict()) is not passes


def test_min_agreement_overrides_and_both_are_reported() -> None:
    # the saturated conversion, let through by an explicit --min-agreement 0.6: it decides, the default still speaks
    report = _report(top1=0.655, stable=0.66, top5=0.9, min_agreement=0.6)
    assert report.passed and not report.default_passed
    gate = report.to_dict()["gate"]
    assert gate == {**gate, "criterion": "min-agreement", "default_passed": False, "min_agreement_passed": True}
    assert report.verdict().startswith("--min-agreement 60.00% passed") and "default gate failed" in report.verdict()
    # and an explicit bar above a good conversion refuses it
    assert not _report(top1=0.935, stable=0.972, top5=1.0, min_agreement=0.99).passed


def test_latency_ratio_is_what_was_measured() -> None:
    data = _report(top1=1.0, stable=1.0, top5=1.0).to_dict()
    assert data["latency_ratio"] == 0.5 and data["cpu"] == "test cpu"


# The default gate on a user's own small folder: no --eval, so 1 sample in 5 is held out of --calib and scored.
# With 168 photos that is 33, and each top-5 miss moves the agreement 3 points. (name, report arguments, passes,
# the checks that fail); the good row is the conversion a point estimate refused (EfficientNet-Lite0 INT8 TFLite,
# 168 photos: 96.2 % stable top-1, 31 of 33 top-5), the broken ones are the calibrations at half and a tenth of the
# real range, at their measured rates.
SMALL_CASES = [
    ("efficientnet-lite0 tflite, 31 of 33 top-5", dict(top1=0.909, stable=0.962, top5=31 / 33), True, None),
    ("efficientnet-lite0 tflite, 30 of 33 top-5", dict(top1=0.909, stable=0.962, top5=30 / 33), True, None),
    # four misses of 33: the bound (94.4 %) is under the bar, the data say agreement is below 95 %
    ("29 of 33 top-5", dict(top1=0.909, stable=0.962, top5=29 / 33), False, "top-5 agreement"),
    ("half-range calibration", dict(top1=0.445, stable=0.444, top5=0.855), False, ("top-1 agreement", "top-5 agreement")),
    ("a tenth of the range", dict(top1=0.04, stable=0.036, top5=0.215), False, ("top-1 agreement", "top-5 agreement")),
]


@pytest.mark.parametrize("name, kwargs, passes, failing", SMALL_CASES, ids=[c[0] for c in SMALL_CASES])
def test_top5_is_judged_with_the_sample_size(name: str, kwargs: dict, passes: bool, failing: str | tuple | None) -> None:
    report = _report(**kwargs, samples=33)
    expected = [] if failing is None else [failing] if isinstance(failing, str) else list(failing)
    assert [c.name for c in report.checks if not c.passed] == expected and report.passed is passes
    top5 = next(c for c in report.to_dict()["gate"]["default_checks"] if c["name"] == "top-5 agreement")
    assert top5["samples"] == 33 and top5["bound"] == 0.95 and top5["upper_bound"] > top5["value"]  # the bar is not lowered
    assert "top-5 agreement" in report.verdict() and "of 33 samples (95 % upper confidence bound" in report.verdict()


def _refused(p: float, n: int) -> float:
    """The probability that the top-5 check refuses a conversion whose true top-5 agreement is ``p``, on ``n``
    samples: the binomial mass of every count the check refuses."""
    from math import comb

    from converters.vision.gate import TOP5_AGREEMENT_MIN, Check

    return sum(comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)
               if not Check("top-5 agreement", k / n, TOP5_AGREEMENT_MIN, samples=n).passed)


@pytest.mark.parametrize("n", [30, 33, 50, 100, 168, 200])
def test_top5_refuses_good_conversions_rarely_and_broken_ones_where_the_set_can_tell(n: int) -> None:
    # A conversion whose true top-5 agreement is 97 % (below every good one measured, 98-100 %): the point value
    # refused it on 26 % of 33-sample sets; the bound refuses it on under 2 % of them at every size.
    assert _refused(0.97, n) < 0.02
    # At the bar itself the bound errs towards passing no more than a 95 % bound should (Wilson's, a little over
    # 5 % at some n: the count is whole), and the half-range calibration's 85.5 % is refused on 100 samples or more
    # almost always; below that, its top-1 agreement (44 %) refuses it (SMALL_CASES).
    assert _refused(0.95, n) < 0.10
    if n >= 100:
        assert _refused(0.855, n) > 0.95


def test_wilson_upper_bound() -> None:
    from converters.vision.gate import wilson_upper

    assert wilson_upper(1.0, 33) == 1.0
    assert wilson_upper(31 / 33, 33) == pytest.approx(0.9797, abs=1e-4)  # (p + z^2/2n + z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)
    bounds = [wilson_upper(0.9, n) for n in (10, 33, 100, 1000, 10**6)]
    assert bounds == sorted(bounds, reverse=True) and bounds[-1] == pytest.approx(0.9, abs=1e-3)  # tighter with more samples
    with pytest.raises(ValueError, match="at least one sample"):
        wilson_upper(0.5, 0)
