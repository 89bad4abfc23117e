"""Vision's front end to the classifier core (:class:`converters.classifier.core.FrontEnd`): what its gate measures,
what its report adds, and what a failed gate advises.

The gate also runs the float model over the evaluation images with every pixel moved by at most one grey level
(:func:`noisy_inputs`): how often float agrees with itself there is the noise floor under the gate's agreement,
and the samples it leaves unchanged are the ones the default gate scores (:func:`gate.agreement_where_stable`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from converters.classifier.core import Gated, Route
from converters.vision import calib as calibration
from converters.vision.gate import GateReport, compare, run_gate
from converters.vision.recipes import Choice, QuantScheme
from converters.vision.source import Source
from runtime.bundle.manifest import Layout, ModelKind, VisionSpec


@dataclass(frozen=True)
class VisionFront:
    source: Source
    labels: list[str] | None
    spec: VisionSpec
    calibration: np.ndarray
    route: Route
    evaluation: calibration.Samples  # what the gate scores: the --eval set, or the samples held out of --calib
    eval_set: Path | None  # --eval
    calib: Path  # --calib
    kind: ClassVar[ModelKind] = ModelKind.VISION

    def gate(self, float_path: Path, model_path: Path, ext: str, min_agreement: float | None) -> Gated:
        ev = self.evaluation
        return run_gate(float_path, model_path, ext, ev.x, ev.labels, min_agreement, noisy_x=noisy_inputs(ev.x, self.spec))

    def describe(self, choice: Choice, ref: np.ndarray) -> dict[str, Any]:
        data = {"equalization": choice.equalization, "evaluation": evaluation_line(self.eval_set, self.calib)}
        if self.source.module is not None:
            data["conversion"] = parity(self.source.module, self.evaluation.x, ref, self.spec.layout)
        return data

    def failure(self, choice: Choice, report: GateReport, data: dict[str, Any]) -> str:
        return (f"accuracy gate failed on {report.samples} {data['evaluation']}: {report.verdict()} (top-1 agreement "
                f"{report.top1_agreement:.2%} on all samples, cosine min {report.cosine_min:.4f}; the float model agrees "
                f"{report.float_self_agreement:.2%} with itself under +-1 grey level of noise on this set); "
                f"nothing was written. Try {remedies(choice, self.source, self.route.equalize)}")

    def extras(self, bundle: Path, work: Path) -> tuple[list[tuple[str, Path]], dict[str, Any]]:
        return [], {}  # labels and the report are every classifier's (converters.classifier.package.write_extras)


def noisy_inputs(x: np.ndarray, spec: VisionSpec, seed: int = 0) -> np.ndarray:
    """``x`` with every pixel moved by -1, 0 or +1 grey level at random. The float model's top-1 agreement with
    itself over these is the noise floor under the gate's agreement on this evaluation set (no quantized model
    can be asked to beat what an invisible change does to the float one); the samples it leaves unchanged are
    the ones whose float decision means something (:func:`gate.agreement_where_stable`)."""
    std = np.asarray(spec.std, np.float32)
    shape = (1, -1, 1, 1) if spec.layout is Layout.NCHW else (1, 1, 1, -1)
    noise = np.random.default_rng(seed).integers(-1, 2, x.shape).astype(np.float32) / std.reshape(shape)
    return (x + noise).astype(np.float32)


def evaluation_line(eval_set: Path | None, calib: Path) -> str:
    """What the gate scored, for the report and the CLI: the --eval set, or the samples held out of --calib."""
    if eval_set is not None:
        return f"samples of --eval {eval_set}"
    return (f"samples held out of --calib {calib} (every {calibration.HOLD_OUT_EVERY}th, "
            f"{100 // calibration.HOLD_OUT_EVERY} %; they did not calibrate): no --eval given")


def remedies(choice: Choice, source: Source, equalized: bool) -> str:
    """What a user can try after a failed gate, only the options that apply to this conversion (``equalized``:
    --equalize on was given)."""
    tries = ["more or more representative --calib data"]
    if choice.quant is QuantScheme.INT8 and source.module is not None and not equalized:
        from converters.vision.equalize import applicable

        if applicable(source.module):
            tries.append("--equalize on (evens out activation ranges across channels before INT8)")
    if choice.quant is not QuantScheme.FP16:
        tries.append("--quant fp16")
    return ", ".join(tries[:-1]) + f", or {tries[-1]}" if len(tries) > 1 else tries[0]


def parity(module: Any, x: np.ndarray, ref: np.ndarray, layout: Layout) -> dict[str, float]:
    """The float converted model against the source framework's own outputs (conversion error, not quantization);
    ``x`` is in the bundle's ``layout``, the module takes NCHW."""
    import torch

    nchw = x if layout is Layout.NCHW else np.moveaxis(x, -1, 1)
    with torch.no_grad():
        # one row at a time: an ExportedProgram keeps the batch size it was exported with
        src = np.concatenate([module(torch.from_numpy(np.ascontiguousarray(nchw[i : i + 1]))).numpy() for i in range(len(nchw))])
    src = src.reshape(len(x), -1)
    m = compare(src, ref, None)
    return {"top1_agreement": m["top1_agreement"], "cosine_min": m["cosine_min"], "max_abs_error": m["max_abs_error"]}
