"""Audio's front end to the classifier core (:class:`converters.classifier.core.FrontEnd`): what its gate measures,
what its report adds, what a failed gate advises, and the front-end models its bundle carries.

A one-output model is a detector: the gate's top-1 agreement is agreement of its decisions at the threshold
(see :func:`converters.vision.gate.compare`), and a labelled evaluation file counts as right by its best window
(:func:`converters.audio.clips.clip_accuracy`).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from converters.audio.clips import ClipSet, clip_accuracy
from converters.classifier.core import Gated, Route
from converters.classifier.memory import onnx_peak_bytes
from converters.vision.calib import HOLD_OUT_EVERY
from converters.vision.gate import GateReport, run_gate
from converters.vision.recipes import Choice
from converters.vision.source import Source
from runtime.bundle.manifest import AudioSpec, ModelKind
from runtime.classify.audio_frontend import FrontEnd


@dataclass(frozen=True)
class AudioFront:
    source: Source
    labels: list[str] | None
    spec: AudioSpec
    calibration: np.ndarray
    evaluation: ClipSet  # what the gate scores: the --eval set, or the files held out of --calib
    frontend_files: list[Path]  # the feature front end's model files, in order
    threshold: float  # a detector's score that counts as detected
    eval_set: Path | None  # --eval
    calib: Path  # --calib
    route: Route = Route()
    kind: ClassVar[ModelKind] = ModelKind.AUDIO

    def gate(self, float_path: Path, model_path: Path, ext: str, min_agreement: float | None) -> Gated:
        ev = self.evaluation
        report, ref, test = run_gate(float_path, model_path, ext, ev.x, None, min_agreement, threshold=self.threshold)
        if ev.labels is not None and (ev.labels >= 0).any():  # accuracy per labelled file, not per window; the gate checks it
            report = replace(
                report,
                labelled=int((ev.labels >= 0).sum()),
                accuracy_float=clip_accuracy(ev, ref, self.threshold),
                accuracy_quant=clip_accuracy(ev, test, self.threshold),
            )
        return report, ref, test

    def describe(self, choice: Choice, ref: np.ndarray) -> dict[str, Any]:
        held = (f"held out of --calib {self.calib} (every {HOLD_OUT_EVERY}th file, or window of an .npz; "
                "they did not calibrate): no --eval given")
        return {"sample_rate": self.spec.sample_rate, "frontend": self.spec.frontend,
                "evaluation": f"--eval {self.eval_set}" if self.eval_set else held}

    def failure(self, choice: Choice, report: GateReport, data: dict[str, Any]) -> str:
        return (f"accuracy gate failed on {report.samples} windows, {data['evaluation']}: {report.verdict()} "
                f"(max abs error {report.max_abs_error:.3g}); nothing was written. "
                "Try more representative --calib audio, or --quant fp16")

    def extras(self, bundle: Path, work: Path) -> tuple[list[tuple[str, Path]], dict[str, Any]]:
        """The front end's model files, copied into the bundle in order, and the front end's activation peak."""
        copies = []
        for i, f in enumerate(self.frontend_files):
            dst = bundle / f"frontend-{i}-{f.name}"
            shutil.copyfile(f, dst)
            copies.append(("frontend", dst))
        return copies, {"frontend_files": tuple(p.name for _, p in copies),
                        "frontend_arena_bytes": frontend_arena(FrontEnd(self.spec.frontend), self.frontend_files, work)}


def frontend_arena(kind: FrontEnd, files: list[Path], work: Path) -> int:
    """The front end's activation peak per call, at the chunk sizes runtime.classify.audio_frontend uses (for the memory plan)."""
    if kind is not FrontEnd.OPENWAKEWORD:
        return 0
    from runtime.classify.audio_frontend import OWW_EMBEDDING_BATCH, OWW_FFT_SAMPLES, OWW_HOP_SAMPLES, OWW_MEL_CHUNK_FRAMES, OWW_MEL_WINDOW

    mel = onnx_peak_bytes(files[0], [1, (OWW_MEL_CHUNK_FRAMES - 1) * OWW_HOP_SAMPLES + OWW_FFT_SAMPLES], work)
    return mel + onnx_peak_bytes(files[1], [OWW_EMBEDDING_BATCH, OWW_MEL_WINDOW, 32, 1], work)
