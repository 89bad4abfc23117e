"""The accuracy gate: the quantized model against the float model on an evaluation set.

Metrics (all over the evaluation samples):

* ``top1_agreement``: the two models' best classes are the same;
* ``top5_agreement``: the float model's best class is among the quantized model's five best;
* ``cosine_min`` / ``cosine_mean``: cosine similarity of the two output vectors (dequantized logits);
* ``max_abs_error``: the largest absolute difference of any output value;
* ``accuracy_float`` / ``accuracy_quant``: top-1 against labels, when the set has them.

Both models run through edgerun's own backends, so what is measured is what ships.
The report also carries sizes and batch-1 latency on one thread.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.backends.base import ClassifierBackend, TensorInfo
from runtime.bundle import TensorQuant
from runtime.classifier import time_calls
from runtime.preprocess import dequantize, quantize

LATENCY_RUNS = 20


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
    min_agreement: float
    float_bytes: int
    quant_bytes: int
    float_latency_ms: float  # median, batch 1, 1 thread
    quant_latency_ms: float

    @property
    def passed(self) -> bool:
        return self.top1_agreement >= self.min_agreement

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["passed"] = self.passed
        return data


def open_model(path: Path, model_format: str, threads: int = 1) -> ClassifierBackend:
    if model_format == "tflite":
        from runtime.backends.litert import LiteRTBackend

        return LiteRTBackend(path, threads=threads)
    from runtime.backends.ort import ORTBackend

    return ORTBackend(path, threads=threads)


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


def run_gate(float_path: Path, quant_path: Path, model_format: str, x: np.ndarray, labels: np.ndarray | None,
             min_agreement: float, threshold: float = 0.5) -> tuple[GateReport, np.ndarray, np.ndarray]:
    with open_model(float_path, model_format) as ref_model, open_model(quant_path, model_format) as test_model:
        ref, test = outputs(ref_model, x), outputs(test_model, x)
        lat_ref, lat_test = latency_ms(ref_model, x), latency_ms(test_model, x)
    metrics = compare(ref, test, labels, threshold)
    report = GateReport(samples=len(x), min_agreement=min_agreement, float_bytes=float_path.stat().st_size,
                        quant_bytes=quant_path.stat().st_size, float_latency_ms=lat_ref, quant_latency_ms=lat_test, **metrics)
    return report, ref, test


def plot(report: GateReport, ref: np.ndarray, test: np.ndarray, title: str, out: Path) -> bool:
    """Agreement scatter (float vs quantized top-1 probability) and a latency bar chart; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        return False
    from runtime.preprocess import softmax

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
