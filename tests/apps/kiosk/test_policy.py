"""The decision policy: the [policy] table's checks (one line each), and the classifier and anomaly rules at the
edges of their thresholds and bands."""

from __future__ import annotations

import math

import numpy as np
import pytest

from apps.kiosk.policy import Policy
from apps.kiosk.types import Verdict
from runtime.errors import BadInput

LABELS = ["good", "scratch", "spot"]


def test_defaults() -> None:
    p = Policy.from_config(None)
    assert p == Policy.from_config({}) == Policy()
    assert (p.good, p.threshold, p.band, p.uncertain, p.anomaly_threshold) == (("good",), 0.5, 0.0, Verdict.REJECT, None)


@pytest.mark.parametrize("table, match", [
    ({"treshold": 0.5}, "unknown setting 'treshold' \\(valid: good, threshold"),  # a typo is named, not ignored
    ({"threshold": 0}, "threshold = 0 is not valid: use a number in \\(0, 1\\]"),  # 0 would call every class
    ({"threshold": 1.5}, "threshold = 1.5"),
    ({"threshold": True}, "threshold = True"),  # TOML true is not a probability
    ({"threshold": float("nan")}, "threshold = nan"),
    ({"threshold": "0.5"}, "threshold = '0.5'"),
    ({"good": []}, "good = \\[\\] must list the classes"),
    ({"good": [""]}, "good class '' is not a class name"),
    ({"good": [3]}, "good class 3"),
    ({"thresholds": [0.5]}, "thresholds must be a table"),
    ({"thresholds": {"scratch": -0.1}}, "thresholds.scratch = -0.1"),
    ({"band": 0.5}, "band = 0.5 is not valid: use a number in \\[0, 0.5\\)"),
    ({"band": 0.2, "threshold": 0.15}, "threshold = 0.15 with band = 0.2 leaves no room"),  # always in the band
    ({"band": 0.2, "thresholds": {"good": 0.9}}, "thresholds.good = 0.9 with band = 0.2"),  # never called
    ({"uncertain": "pass"}, "uncertain = 'pass' is not valid: use one of 'reject', 'review'"),  # never pass on doubt
    ({"anomaly_threshold": 0}, "anomaly_threshold = 0"),
    ({"anomaly_threshold": float("inf")}, "anomaly_threshold = inf"),
    ({"anomaly_band": 1}, "anomaly_band = 1"),
    ("threshold = 0.5", "expected a table of settings, not str"),
])
def test_bad_settings_are_one_line(table: object, match: str) -> None:
    with pytest.raises(BadInput, match=match) as info:
        Policy.from_config(table)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_good_may_be_one_name_and_duplicates_collapse() -> None:
    assert Policy.from_config({"good": "ok"}).good == ("ok",)
    assert Policy.from_config({"good": ["ok", " ok", "fine"]}).good == ("ok", "fine")


def test_labels_the_model_does_not_have_are_refused() -> None:
    p = Policy.from_config({"good": ["good"], "thresholds": {"missing_hole": 0.2}})
    with pytest.raises(BadInput, match="policy names class 'missing_hole' that model m does not have .its classes: good, scratch, spot"):
        p.check_labels(LABELS, "model m")
    Policy().check_labels(LABELS)


def probs(*p: float) -> np.ndarray:
    return np.array(p, np.float32)


# (policy table, probabilities of good/scratch/spot, verdict, reason start, confidence)
CLASS_CASES = [
    ({}, (0.9, 0.05, 0.05), Verdict.PASS, "good 0.90 >= 0.50", 0.9),
    ({}, (0.5, 0.25, 0.25), Verdict.PASS, "good 0.50 >= 0.50", 0.5),  # on the threshold is called
    ({}, (0.1, 0.8, 0.1), Verdict.REJECT, "scratch 0.80 >= 0.50", 0.8),
    ({}, (0.4, 0.3, 0.3), Verdict.REJECT, "uncertain: no class called (top good 0.40 < 0.50)", 0.4),  # fail safe
    ({"uncertain": "review"}, (0.4, 0.3, 0.3), Verdict.REVIEW, "uncertain: no class called", 0.4),
    # a critical defect rejects at a low probability even when "good" is called too
    ({"thresholds": {"spot": 0.2}}, (0.7, 0.05, 0.25), Verdict.REJECT, "spot 0.25 >= 0.20", 0.25),
    # of two called defects the more probable one is named
    ({"threshold": 0.3}, (0.0, 0.35, 0.65), Verdict.REJECT, "spot 0.65 >= 0.30", 0.65),
    # a defect near its threshold (in the band) makes the part uncertain, even with "good" called
    ({"band": 0.1, "uncertain": "review"}, (0.55, 0.45, 0.0), Verdict.REVIEW, "uncertain: scratch 0.45 within 0.10 of 0.50", 0.45),
    ({"band": 0.1}, (0.65, 0.35, 0.0), Verdict.PASS, "good 0.65 >= 0.50", 0.65),  # below the band: not a defect
    ({"band": 0.1, "uncertain": "review"}, (0.58, 0.21, 0.21), Verdict.REVIEW, "uncertain: no class called (top good 0.58 < 0.60)", 0.58),
    ({"good": ["good", "spot"]}, (0.1, 0.1, 0.8), Verdict.PASS, "spot 0.80 >= 0.50", 0.8),  # several classes pass
]


@pytest.mark.parametrize("table, p, verdict, reason, confidence", CLASS_CASES)
def test_classifier_rule(table: dict, p: tuple, verdict: Verdict, reason: str, confidence: float) -> None:
    r = Policy.from_config(table).decide_classes(probs(*p), LABELS)
    assert (r.verdict, r.confidence) == (verdict, pytest.approx(confidence, abs=1e-6))
    assert r.reason.startswith(reason), r.reason
    assert r.score == pytest.approx(confidence, abs=1e-6)


def test_classifier_rule_refuses_scores_that_do_not_match_the_labels() -> None:
    with pytest.raises(BadInput, match="2 class scores for 3 labels"):
        Policy().decide_classes(probs(0.5, 0.5), LABELS)
    with pytest.raises(BadInput, match="not finite"):
        Policy().decide_classes(probs(math.nan, 0.5, 0.5), LABELS)


# (policy table, score, bundle threshold, verdict, reason start, confidence)
ANOMALY_CASES = [
    ({}, 1.0, 2.0, Verdict.PASS, "anomaly 1 < 2", 0.5),
    ({}, 2.0, 2.0, Verdict.REJECT, "anomaly 2 >= 2", 0.0),  # on the threshold rejects
    ({}, 5.0, 2.0, Verdict.REJECT, "anomaly 5 >= 2", 1.0),  # confidence saturates at twice the threshold
    ({}, 0.0, 2.0, Verdict.PASS, "anomaly 0 < 2", 1.0),
    ({"anomaly_threshold": 3.0}, 2.5, 2.0, Verdict.PASS, "anomaly 2.5 < 3", 1 / 6),  # the config overrides the bundle
    ({"anomaly_band": 0.1}, 1.85, 2.0, Verdict.REJECT, "uncertain: anomaly 1.85 within 10% of 2", 0.075),
    ({"anomaly_band": 0.1, "uncertain": "review"}, 2.1, 2.0, Verdict.REVIEW, "uncertain: anomaly 2.1", 0.05),
    ({"anomaly_band": 0.1}, 2.2, 2.0, Verdict.REJECT, "anomaly 2.2 >= 2", 0.1),
    ({"anomaly_band": 0.1}, 1.79, 2.0, Verdict.PASS, "anomaly 1.79 < 2", 0.105),
]


@pytest.mark.parametrize("table, score, bundle, verdict, reason, confidence", ANOMALY_CASES)
def test_anomaly_rule(table: dict, score: float, bundle: float, verdict: Verdict, reason: str, confidence: float) -> None:
    r = Policy.from_config(table).decide_anomaly(score, bundle)
    assert (r.verdict, r.score) == (verdict, score)
    assert r.reason.startswith(reason), r.reason
    assert r.confidence == pytest.approx(confidence, abs=1e-9)


def test_anomaly_rule_needs_a_threshold() -> None:
    with pytest.raises(BadInput, match="no usable anomaly threshold .bundle: None.; set \\[policy\\] anomaly_threshold"):
        Policy().decide_anomaly(1.0, None)
    assert Policy.from_config({"anomaly_threshold": 1.0}).decide_anomaly(0.5, None).verdict is Verdict.PASS
    with pytest.raises(BadInput, match="anomaly score nan"):
        Policy().decide_anomaly(math.nan, 1.0)
