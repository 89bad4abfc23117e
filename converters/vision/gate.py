"""The accuracy gate: the quantized model against the float model on an evaluation set.

Metrics (all over the evaluation samples):

* ``top1_agreement``: the two models' best classes are the same;
* ``top5_agreement``: the float model's best class is among the quantized model's five best;
* ``cosine_min`` / ``cosine_mean``: cosine similarity of the two output vectors (dequantized logits);
* ``max_abs_error``: the largest absolute difference of any output value;
* ``accuracy_float`` / ``accuracy_quant``: top-1 against labels, when the set has them;
* ``float_self_agreement``, ``top1_agreement_stable``, ``stable_samples``: the float model against itself under
  +-1 grey level of input noise (the noise floor of top-1 agreement on this set), and top-1 agreement over the
  samples whose float decision that noise leaves alone (:func:`agreement_where_stable`), when noisy inputs are given.

Top-5 agreement is judged with its sample size (:func:`wilson_upper`): it fails only when its one-sided 95 %
upper confidence bound is under the bar, that is when the samples show with 95 % confidence that the quantized
model keeps the float answer among its five best less often than TOP5_AGREEMENT_MIN. On 33 held-out photos one
miss is 3 points, so a point estimate would let two misses refuse a conversion that is as good as the shipped ones.

The verdict (:class:`GateReport.passed`) is the default gate (:func:`default_checks`) unless the user gave
``--min-agreement``, which then decides alone (top-1 agreement over all samples); the report carries both.
Both models run through edgerun's own backends, so what is measured is what ships. The report also carries
sizes and batch-1 latency on one thread, measured here at conversion, with the ratio and this CPU's name.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from devices.backends import for_format
from devices.placement import cpu_placement
from runtime.backends import open_backend
from runtime.backends.base import ClassifierBackend, TensorInfo
from runtime.bundle.manifest import TensorQuant
from runtime.classify.classifier import time_calls
from runtime.classify.preprocess import dequantize, quantize

LATENCY_RUNS = 20
# The default gate (default_checks), set from what was measured on bench/vision.py's 200 images (docs/benchmarks.md,
# vision). Good conversions, the ones shipped (GPTQ INT8, default options): top-1 agreement over the samples
# whose float decision is stable 78.6-80.1 % (MobileNetV2 ONNX/TFLite) and 96.6-97.2 % (EfficientNet-Lite0),
# top-5 agreement 98-100 %. Broken ones: ORT's saturating U8S8 kernels on an x86 CPU without VNNI, 65.5 % top-1
# over all 200 (at most 66.8 % of the 196 stable ones); calibration at half the inputs' real range, 44.4 % and
# top-5 85.5 %; at a tenth, 3.6 % and 21.5 %. Each bound sits between the two groups.
STABLE_AGREEMENT_MIN = 0.70
TOP5_AGREEMENT_MIN = 0.95
ACCURACY_DROP_MAX = 0.03  # 3 points of top-1 accuracy against labels (INT8 digits lose under 2)
# A detector's yes/no decision agrees by chance on most windows (nothing is said in most of them): the wake-word
# head calibrated on silence still agrees on 95.3 % of its evaluation windows, the good bundles on 99-100 %.
DETECTOR_AGREEMENT_MIN = 0.99
# Top-5 agreement is judged by the upper end of its one-sided 95 % Wilson score interval (z of the normal's 95th
# percentile). Good conversions measure 98-100 % and broken ones 85.5 % or less, so the bar has room for sampling
# error: 30 of 33 held-out samples (bound 96.3 %) pass and 29 (94.4 %) fail; of 200, 185 pass and 184 fail; the
# half-range calibration's 85.5 % stays refused down to 15 samples (bound 94.9 %). Top-1 agreement keeps its point
# value: its bar sits 3 points over a measured broken conversion (66.8 % of 196), which a bound would let through.
CONFIDENCE_Z = 1.6449


@dataclass(frozen=True)
class Check:
    """One criterion of the default gate: ``value`` against ``bound`` (a floor, or a ceiling when not ``at_least``)."""

    name: str
    value: float
    bound: float
    at_least: bool = True
    over: str = ""  # what the value is measured over, for the message
    samples: int = 0  # > 0: a floor judged by the value's upper confidence bound over this many samples (wilson_upper)

    @property
    def upper(self) -> float | None:
        """The one-sided 95 % upper confidence bound of ``value`` over ``samples``; None for a point check."""
        return wilson_upper(self.value, self.samples) if self.samples > 0 and self.at_least else None

    @property
    def passed(self) -> bool:  # values are ratios of sample counts: 1e-9 absorbs their float rounding (0.8 - 0.75)
        judged = self.value if self.upper is None else self.upper
        return judged >= self.bound - 1e-9 if self.at_least else judged <= self.bound + 1e-9

    def describe(self) -> str:
        if self.upper is None:
            return f"{self.name} {self.value:.1%}{self.over} ({'>=' if self.at_least else '<='} {self.bound:.0%})"
        return (f"{self.name} {self.value:.1%} of {self.samples} samples (95 % upper confidence bound {self.upper:.1%} "
                f">= {self.bound:.0%})")


def wilson_upper(value: float, samples: int, z: float = CONFIDENCE_Z) -> float:
    """The upper end of the Wilson score interval of a proportion ``value`` measured on ``samples`` samples, at the
    one-sided confidence ``z`` gives (1.6449: 95 %). A true proportion at or above the result would show a value this
    low less than 5 % of the time; it is above ``value`` when ``value`` < 1, by about z * sqrt(v (1 - v) / n)."""
    if samples < 1:
        raise ValueError(f"a confidence bound needs at least one sample, got {samples}")
    z2 = z * z / samples
    centre = value + z2 / 2
    spread = z * np.sqrt(value * (1 - value) / samples + z2 / (4 * samples))
    return float(min(1.0, (centre + spread) / (1 + z2)))


def default_checks(*, samples: int, top1_agreement: float, top5_agreement: float, top1_agreement_stable: float | None = None,
                   stable_samples: int | None = None, labelled: int = 0, accuracy_float: float | None = None,
                   accuracy_quant: float | None = None, classes: int | None = None) -> list[Check]:
    """The default gate: the quantized model keeps the float model's decisions where they mean something, keeps
    its answer among its own five best, and costs little accuracy where labels say what is right.

    * top-1 agreement over the samples whose float top-1 survives +-1 grey level of noise (over all samples when
      no noise was measured, or none survives it): a disagreement on a sample the float model itself flips under
      invisible noise says nothing about the quantization;
    * top-5 agreement (the float top-1 among the quantized model's five best), over every sample, for models with
      more than five classes (with five or fewer, or a detector's one score, it says nothing top-1 does not),
      judged by its 95 % upper confidence bound over the ``samples`` (:func:`wilson_upper`): refused only where the
      set shows the agreement is under the bar, not where two misses of 33 put its point value there;
    * with labels: accuracy lost against the float model, at most ACCURACY_DROP_MAX or one labelled sample,
      whichever is more (one sample of 20 is 5 points: a small set cannot resolve less).

    A detector (one score) is judged on its decisions over every sample instead, at DETECTOR_AGREEMENT_MIN.
    """
    if classes == 1:
        checks = [Check("decision agreement", top1_agreement, DETECTOR_AGREEMENT_MIN, over=f" on all {samples} samples")]
    elif top1_agreement_stable is not None:
        checks = [Check("top-1 agreement", top1_agreement_stable, STABLE_AGREEMENT_MIN,
                        over=f" on the {stable_samples} samples whose float top-1 survives the noise")]
    else:
        checks = [Check("top-1 agreement", top1_agreement, STABLE_AGREEMENT_MIN, over=f" on all {samples} samples")]
    if classes is None or classes > 5:
        checks.append(Check("top-5 agreement", top5_agreement, TOP5_AGREEMENT_MIN, samples=samples))
    if accuracy_float is not None and accuracy_quant is not None and labelled:
        checks.append(Check("accuracy drop", accuracy_float - accuracy_quant, max(ACCURACY_DROP_MAX, 1 / labelled),
                            at_least=False, over=f" on {labelled} labelled"))
    return checks


@dataclass(frozen=True)
class GateReport:
    samples: int
    top1_agreement: float
    top5_agreement: float
    cosine_min: float
    cosine_mean: float
    max_abs_error: float
    labelled: int  # samples with a known label
    accuracy_float: float | None
    accuracy_quant: float | None
    min_agreement: float | None  # --min-agreement: None for the default gate
    float_bytes: int
    quant_bytes: int
    float_latency_ms: float  # median, batch 1, 1 thread, measured at conversion on ``cpu``
    quant_latency_ms: float
    cpu: str = "unknown"
    float_self_agreement: float | None = None  # None: no noisy inputs given
    top1_agreement_stable: float | None = None
    stable_samples: int | None = None
    classes: int | None = None  # output columns; 1 for a detector's score

    @property
    def checks(self) -> list[Check]:
        return default_checks(samples=self.samples, top1_agreement=self.top1_agreement, top5_agreement=self.top5_agreement,
                              top1_agreement_stable=self.top1_agreement_stable, stable_samples=self.stable_samples,
                              labelled=self.labelled, accuracy_float=self.accuracy_float, accuracy_quant=self.accuracy_quant,
                              classes=self.classes)

    @property
    def default_passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def passed(self) -> bool:
        if self.min_agreement is not None:
            return self.top1_agreement >= self.min_agreement
        return self.default_passed

    @property
    def latency_ratio(self) -> float | None:
        """Quantized over float latency here: below 1 is faster (None if float measured no time at all)."""
        return self.quant_latency_ms / self.float_latency_ms if self.float_latency_ms > 0 else None

    def verdict(self) -> str:
        """Which criterion decided and what each said, in one line (the CLI's and a failed gate's)."""
        default = f"default gate {'passed' if self.default_passed else 'failed'}: " + ", ".join(
            c.describe() + ("" if c.passed else " FAILED") for c in self.checks)
        if self.min_agreement is None:
            return f"{default}; --min-agreement not given"
        mine = (f"--min-agreement {self.min_agreement:.2%} {'passed' if self.passed else 'failed'} "
                f"(top-1 agreement {self.top1_agreement:.1%} on all {self.samples} samples)")
        return f"{mine} and decides; {default}"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(passed=self.passed, latency_ratio=self.latency_ratio, gate={
            "criterion": "default" if self.min_agreement is None else "min-agreement",
            "default_passed": self.default_passed,
            "default_checks": [{**asdict(c), "upper_bound": c.upper, "passed": c.passed} for c in self.checks],
            "min_agreement_passed": None if self.min_agreement is None else self.top1_agreement >= self.min_agreement,
            "verdict": self.verdict(),
        })
        return data


def open_model(path: Path, model_format: str, threads: int = 1) -> ClassifierBackend:
    name = for_format(model_format).name
    return open_backend(name, path, None, cpu_placement(name, threads))


def tensor_quant(info: TensorInfo) -> TensorQuant:
    return TensorQuant(info.dtype, info.scale, info.zero_point)


def outputs(backend: ClassifierBackend, x: np.ndarray) -> np.ndarray:
    """Float inputs -> dequantized outputs, one row per sample."""
    y = backend.run(quantize(x, tensor_quant(backend.input)))
    return dequantize(y, tensor_quant(backend.output)).reshape(len(x), -1)


def latency_ms(backend: ClassifierBackend, x: np.ndarray, runs: int = LATENCY_RUNS) -> float:
    return float(np.median(time_calls(backend, quantize(x[:1], tensor_quant(backend.input)), runs)) * 1000)


def decisions(out: np.ndarray, threshold: float = 0.5) -> np.ndarray:
    """Each sample's top-1 class; for one output column (a detector's score), its decision: score >= ``threshold``."""
    return (out[:, 0] >= threshold).astype(int) if out.shape[1] == 1 else out.argmax(1)


def compare(ref: np.ndarray, test: np.ndarray, labels: np.ndarray | None, threshold: float = 0.5) -> dict[str, Any]:
    """The metrics above. One output column is a detector's score: "top-1" is then its decision (score >= ``threshold``),
    top-5 agreement equals top-1, and the cosine is taken over the score column of all samples together."""
    top1_ref, top1_test = decisions(ref, threshold), decisions(test, threshold)
    if ref.shape[1] == 1:
        top5_hit = top1_ref == top1_test
        cos = np.array([float(ref[:, 0] @ test[:, 0] / max(np.linalg.norm(ref) * np.linalg.norm(test), 1e-30))])
    else:
        top5_hit = (np.argsort(-test, axis=1)[:, :5] == top1_ref[:, None]).any(1)
        dot = (ref * test).sum(1)
        norms = np.linalg.norm(ref, axis=1) * np.linalg.norm(test, axis=1)
        cos = np.where(norms > 0, dot / np.maximum(norms, 1e-30), 1.0)
    out: dict[str, Any] = {
        "top1_agreement": float((top1_ref == top1_test).mean()),
        "top5_agreement": float(top5_hit.mean()),
        "cosine_min": float(cos.min()),
        "cosine_mean": float(cos.mean()),
        "max_abs_error": float(np.abs(ref - test).max()),
        "labelled": 0,
        "accuracy_float": None,
        "accuracy_quant": None,
    }
    if labels is not None:
        known = labels >= 0
        out["labelled"] = int(known.sum())
        if known.any():
            out["accuracy_float"] = float((top1_ref[known] == labels[known]).mean())
            out["accuracy_quant"] = float((top1_test[known] == labels[known]).mean())
    return out


def agreement_where_stable(ref: np.ndarray, noisy: np.ndarray, test: np.ndarray, threshold: float = 0.5) -> tuple[float | None, int]:
    """Top-1 agreement of ``test`` with ``ref`` over the samples whose float top-1 survives an invisible input
    change (``noisy``: the float model's outputs on the same inputs with +-1 grey level of noise), and how many
    such samples there are; None when there are none.

    A sample whose float top-1 flips under noise no one can see sits on a decision boundary: any quantization
    moves it as readily, and counting it measures the evaluation set as much as the model.
    """
    top1 = decisions(ref, threshold)
    stable = top1 == decisions(noisy, threshold)
    n = int(stable.sum())
    return (float((top1 == decisions(test, threshold))[stable].mean()) if n else None), n


def cpu_name() -> str:
    """This machine's CPU, as /proc/cpuinfo names it (where the latency in a report was measured)."""
    from devices.cpu import read_cpu
    from devices.rootfs import RootFS

    return read_cpu(RootFS.at("/")).model


def run_gate(float_path: Path, quant_path: Path, model_format: str, x: np.ndarray, labels: np.ndarray | None,
             min_agreement: float | None, threshold: float = 0.5,
             noisy_x: np.ndarray | None = None) -> tuple[GateReport, np.ndarray, np.ndarray]:
    """Both models over ``x`` (and the float one over ``noisy_x``, the same inputs with invisible noise, when
    given): the report, the float outputs and the quantized outputs."""
    with open_model(float_path, model_format) as ref_model, open_model(quant_path, model_format) as test_model:
        ref, test = outputs(ref_model, x), outputs(test_model, x)
        noisy = None if noisy_x is None else outputs(ref_model, noisy_x)
        lat_ref, lat_test = latency_ms(ref_model, x), latency_ms(test_model, x)
    metrics = compare(ref, test, labels, threshold)
    if noisy is not None:
        stable, n = agreement_where_stable(ref, noisy, test, threshold)
        metrics.update(top1_agreement_stable=stable, stable_samples=n, float_self_agreement=n / len(x))
    report = GateReport(samples=len(x), min_agreement=min_agreement, float_bytes=float_path.stat().st_size,
                        quant_bytes=quant_path.stat().st_size, float_latency_ms=lat_ref, quant_latency_ms=lat_test,
                        cpu=cpu_name(), classes=ref.shape[1], **metrics)
    return report, ref, test


def plot(report: GateReport, ref: np.ndarray, test: np.ndarray, title: str, out: Path) -> bool:
    """Agreement scatter (float vs quantized top-1 probability) and a latency bar chart; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        return False
    from runtime.classify.preprocess import softmax

    if ref.shape[1] == 1:  # a detector: its scores, and the same decision at 0.5
        x, y = ref[:, 0], test[:, 0]
        agree = (x >= 0.5) == (y >= 0.5)
    else:
        p_ref, p_test = softmax(ref), softmax(test)
        top = ref.argmax(1)
        agree = top == test.argmax(1)
        x, y = p_ref[np.arange(len(top)), top], p_test[np.arange(len(top)), top]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 4), dpi=80)
    a.scatter(x[agree], y[agree], s=10, c="tab:blue", label=f"same top-1 ({agree.sum()})")
    a.scatter(x[~agree], y[~agree], s=18, c="tab:red", marker="x", label=f"different ({(~agree).sum()})")
    a.plot([0, 1], [0, 1], lw=0.5, c="gray")
    a.set(xlabel="float: probability of its top-1", ylabel="quantized: probability of that class",
          title=f"top-1 agreement {report.top1_agreement:.1%}")
    a.legend(loc="lower right", fontsize=8)
    b.bar(["float", "quantized"], [report.float_latency_ms, report.quant_latency_ms], color=["gray", "tab:blue"])
    b.set(ylabel="ms (batch 1, 1 thread, median)", title="latency")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, format="png")
    plt.close(fig)
    return True
