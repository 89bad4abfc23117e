"""The decision policy: a model's output for one part -> pass, reject or review, with a reason and a confidence.

Built from the ``[policy]`` table of kiosk.toml (every key optional)::

    [policy]
    good = ["good"]          # classifier bundles: the classes that pass; every other class is a defect
    threshold = 0.5          # a class is called when its probability reaches its threshold...
    thresholds = { scratch = 0.3, missing_hole = 0.2 }   # ...per class (default: threshold)
    band = 0.05              # uncertain band, probability units: t - band <= p < t + band is neither called nor clear
    uncertain = "review"     # where uncertain parts go: "reject" (the default: fail safe) or "review"
    anomaly_threshold = 2.4  # anomaly bundles: score >= threshold rejects (default: the bundle's calibrated one)
    anomaly_band = 0.1       # uncertain band as a fraction of the anomaly threshold: t(1 - b) <= score < t(1 + b)

Classifier rule, in this order: a defect class called (p >= t + band) rejects (the most probable one is named);
a defect class in its band makes the part uncertain; a good class called passes; anything else (nothing called,
a good class only in its band) is uncertain. Anomaly rule: above the band rejects, below it passes, in it is
uncertain. Confidence is the called class's probability (the top class's for an uncertain part), or for anomaly
scores ``min(1, |score - t| / t)``: 0 on the threshold, 1 at twice it or at zero.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from apps.kiosk.types import Verdict
from runtime.errors import BadInput

KEYS = ("good", "threshold", "thresholds", "band", "uncertain", "anomaly_threshold", "anomaly_band")
ROUTES = (Verdict.REJECT, Verdict.REVIEW)
MAX_CLASSES = 10_000  # a thresholds table longer than any label file we accept is a mistake


@dataclass(frozen=True)
class Ruling:
    """What the policy made of one model output. ``score``: the named class's probability or the anomaly score;
    ``label``: the class named in the reason (None for anomaly scores)."""

    verdict: Verdict
    reason: str
    confidence: float
    score: float
    label: str | None = None


def _number(key: str, value: Any, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
    if not ok:
        span = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        raise BadInput(f"policy: {key} = {value!r} is not valid: use a number in {span}")
    return float(value)


def _label(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 200:
        raise BadInput(f"policy: {key} {value!r} is not a class name (a non-empty string)")
    return value.strip()


@dataclass(frozen=True)
class Policy:
    good: tuple[str, ...] = ("good",)
    threshold: float = 0.5
    thresholds: Mapping[str, float] = field(default_factory=dict)
    band: float = 0.0
    uncertain: Verdict = Verdict.REJECT
    anomaly_threshold: float | None = None  # None: the bundle's
    anomaly_band: float = 0.0

    @classmethod
    def from_config(cls, table: Mapping[str, Any] | None) -> Policy:
        """The ``[policy]`` table (None or {} for the defaults); one-line BadInput naming a bad key or value."""
        if table is None:
            return cls()
        if not isinstance(table, Mapping):
            raise BadInput(f"policy: expected a table of settings, not {type(table).__name__}")
        unknown = sorted(set(table) - set(KEYS))
        if unknown:
            raise BadInput(f"policy: unknown setting {', '.join(map(repr, unknown))} (valid: {', '.join(KEYS)})")
        out: dict[str, Any] = {}
        if "good" in table:
            good = table["good"]
            good = [good] if isinstance(good, str) else good
            if not isinstance(good, Sequence) or not good or len(good) > MAX_CLASSES:
                raise BadInput(f"policy: good = {table['good']!r} must list the classes that pass, e.g. [\"good\"]")
            out["good"] = tuple(dict.fromkeys(_label("good class", g) for g in good))
        if "threshold" in table:
            out["threshold"] = _number("threshold", table["threshold"], 0, 1, lo_open=True)
        if "thresholds" in table:
            per = table["thresholds"]
            if not isinstance(per, Mapping) or len(per) > MAX_CLASSES:
                raise BadInput(f"policy: thresholds must be a table of class = probability, not {type(per).__name__}")
            out["thresholds"] = {_label("thresholds class", k): _number(f"thresholds.{k}", v, 0, 1, lo_open=True)
                                 for k, v in per.items()}
        if "band" in table:
            out["band"] = _number("band", table["band"], 0, 0.5, hi_open=True)
        if "uncertain" in table:
            route = table["uncertain"]
            valid = [r.value for r in ROUTES]
            if route not in valid:
                raise BadInput(f"policy: uncertain = {route!r} is not valid: use one of {', '.join(map(repr, valid))}")
            out["uncertain"] = Verdict(route)
        if table.get("anomaly_threshold") is not None:
            out["anomaly_threshold"] = _number("anomaly_threshold", table["anomaly_threshold"], 0, 1e12, lo_open=True)
        if "anomaly_band" in table:
            out["anomaly_band"] = _number("anomaly_band", table["anomaly_band"], 0, 1, hi_open=True)
        policy = cls(**out)
        for name, t in [("threshold", policy.threshold), *((f"thresholds.{k}", v) for k, v in policy.thresholds.items())]:
            if not policy.band < t <= 1 - policy.band:  # else its class would always, or never, be in the band
                raise BadInput(f"policy: {name} = {t:g} with band = {policy.band:g} leaves no room: "
                               f"use thresholds in ({policy.band:g}, {1 - policy.band:g}] or a smaller band")
        return policy

    # -- classifier bundles -------------------------------------------------------------------------------------------
    def check_labels(self, labels: Sequence[str], model: str = "the model") -> None:
        """Refuse a policy that names classes ``labels`` does not have (at start and before a swap)."""
        known = set(labels)
        named = [*self.good, *self.thresholds]
        missing = [c for c in dict.fromkeys(named) if c not in known]
        if missing:
            shown = ", ".join(list(labels)[:20]) + (", ..." if len(labels) > 20 else "")
            raise BadInput(f"policy names class {', '.join(map(repr, missing))} that {model} does not have "
                           f"(its classes: {shown or 'none'})")

    def threshold_of(self, label: str) -> float:
        return self.thresholds.get(label, self.threshold)

    def decide_classes(self, probs: np.ndarray, labels: Sequence[str]) -> Ruling:
        """One part's class probabilities (in ``labels`` order) -> its ruling."""
        p = np.asarray(probs, dtype=np.float64).reshape(-1)
        if len(p) != len(labels) or not np.all(np.isfinite(p)):
            raise BadInput(f"policy: {len(p)} class scores for {len(labels)} labels, or not finite")
        called_bad, borderline_bad, called_good = [], [], []
        for i, label in enumerate(labels):
            t = self.threshold_of(label)
            good = label in self.good
            if p[i] >= t + self.band:
                (called_good if good else called_bad).append(i)
            elif p[i] >= t - self.band and not good:
                borderline_bad.append(i)
        best = lambda idx: max(idx, key=lambda i: p[i])  # noqa: E731
        if called_bad:
            i = best(called_bad)
            return Ruling(Verdict.REJECT, f"{labels[i]} {p[i]:.2f} >= {self.threshold_of(labels[i]):.2f}", float(p[i]),
                          float(p[i]), labels[i])
        if borderline_bad:
            i = best(borderline_bad)
            t = self.threshold_of(labels[i])
            return Ruling(self.uncertain, f"uncertain: {labels[i]} {p[i]:.2f} within {self.band:.2f} of {t:.2f}",
                          float(p[i]), float(p[i]), labels[i])
        if called_good:
            i = best(called_good)
            return Ruling(Verdict.PASS, f"{labels[i]} {p[i]:.2f} >= {self.threshold_of(labels[i]):.2f}", float(p[i]),
                          float(p[i]), labels[i])
        i = int(np.argmax(p))
        return Ruling(self.uncertain, f"uncertain: no class called (top {labels[i]} {p[i]:.2f} "
                                      f"< {self.threshold_of(labels[i]) + self.band:.2f})", float(p[i]), float(p[i]), labels[i])

    # -- anomaly bundles ----------------------------------------------------------------------------------------------
    def anomaly_threshold_for(self, bundle_threshold: float | None) -> float:
        t = self.anomaly_threshold if self.anomaly_threshold is not None else bundle_threshold
        if t is None or not math.isfinite(t) or t <= 0:
            raise BadInput(f"policy: no usable anomaly threshold (bundle: {bundle_threshold!r}); set [policy] anomaly_threshold")
        return float(t)

    def decide_anomaly(self, score: float, bundle_threshold: float | None) -> Ruling:
        """One part's anomaly score -> its ruling, against the policy's threshold or else the bundle's."""
        t = self.anomaly_threshold_for(bundle_threshold)
        s = float(score)
        if not math.isfinite(s):
            raise BadInput(f"policy: anomaly score {score!r} is not a finite number")
        confidence = min(1.0, abs(s - t) / t)
        lo, hi = t * (1 - self.anomaly_band), t * (1 + self.anomaly_band)
        if s >= hi:
            return Ruling(Verdict.REJECT, f"anomaly {s:.3g} >= {t:.3g}", confidence, s)
        if s >= lo:
            return Ruling(self.uncertain, f"uncertain: anomaly {s:.3g} within {self.anomaly_band:.0%} of {t:.3g}",
                          confidence, s)
        return Ruling(Verdict.PASS, f"anomaly {s:.3g} < {t:.3g}", confidence, s)

    def to_dict(self) -> dict[str, Any]:
        return {"good": list(self.good), "threshold": self.threshold, "thresholds": dict(self.thresholds), "band": self.band,
                "uncertain": self.uncertain.value, "anomaly_threshold": self.anomaly_threshold, "anomaly_band": self.anomaly_band}
