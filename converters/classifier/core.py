"""One classifier conversion, start to finish, whatever the input: source -> calibrate -> quantize -> gate -> package.

A kind of model (vision, audio) reads its source, its input spec and its calibration and evaluation data, and
hands them to :func:`convert` as a :class:`FrontEnd`, with the few steps where it differs: what its gate
measures, what its report adds, what a failed gate advises, and which files its bundle carries beside the model.
The rest is this module's: the float and quantized models (:mod:`converters.classifier.quantize`), the shared
report fields, the gate's verdict, and the bundle (:mod:`converters.classifier.package`).

Everything is written under a temporary directory beside ``--out`` and becomes visible only at the end, by one
rename (bundle directory) or by :func:`runtime.bundle.store.pack` (``.edgerun`` file, itself temp + rename). Any failure,
including a failed accuracy gate (:class:`runtime.errors.QualityGateFailed`, exit 7), removes the temporary
directory: nothing is left behind.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from converters.classifier.package import make_manifest, package, write_extras
from converters.classifier.quantize import build_quantized
from converters.vision.gate import GateReport
from converters.vision.recipes import Choice, Format, QuantScheme, Rounding
from converters.vision.source import Source
from runtime.bundle.manifest import Manifest, ModelKind
from runtime.errors import BadInput, QualityGateFailed


@dataclass(frozen=True)
class Options:
    """What every classifier conversion takes; each kind's options add their own."""

    model: str
    calib: Path
    out: Path
    quant: QuantScheme = QuantScheme.AUTO
    fmt: Format = Format.TFLITE
    rounding: Rounding = Rounding.GPTQ
    labels: Path | None = None
    eval: Path | None = None
    min_agreement: float | None = None  # None: the default gate (converters.vision.gate.default_checks)
    name: str | None = None
    version: str | None = None


@dataclass(frozen=True)
class Route:
    """How the quantize step exports a PyTorch source (:func:`converters.classifier.quantize.build_quantized`)."""

    nhwc: bool = False  # a layout transpose in front of the module for TFLite
    onnx_module: Any = None  # the module the ONNX export takes (None: the source's own)
    equalize: bool = False  # try activation-equalized INT8 candidates


Gated = tuple[GateReport, np.ndarray, np.ndarray]  # the gate's report, the float outputs, the quantized outputs


class FrontEnd(Protocol):
    """What one kind of model brings to :func:`convert`: read before any work is written, then asked at each step."""

    kind: ModelKind
    source: Source
    labels: list[str] | None  # class names for labels.txt
    spec: Any  # the bundle's VisionSpec or AudioSpec; the core fills in quantization, input, output and arena_bytes
    calibration: np.ndarray  # the model inputs the quantizer calibrates on
    route: Route

    def gate(self, float_path: Path, model_path: Path, ext: str, min_agreement: float | None) -> Gated:
        """Both models over the evaluation set (never calibrated on), measured as this kind of model is judged."""
        ...

    def describe(self, choice: Choice, ref: np.ndarray) -> dict[str, Any]:
        """The report's fields beyond the shared ones (the gate's, recipe, why, rounding, format, calibration_samples);
        ``ref``: the float model's outputs over the evaluation set."""
        ...

    def failure(self, choice: Choice, report: GateReport, data: dict[str, Any]) -> str:
        """The one line a failed gate raises: what failed, that nothing was written, and what to try."""
        ...

    def extras(self, bundle: Path, work: Path) -> tuple[list[tuple[str, Path]], dict[str, Any]]:
        """Files the bundle carries beside the model, written into ``bundle`` as (role, path), and what they add to the spec."""
        ...


@dataclass(frozen=True)
class Result:
    manifest: Manifest
    out: Path
    report: dict[str, Any]


def check_output(out: Path, min_agreement: float | None) -> None:
    """Refusals before any work: an existing --out, a missing parent directory, an agreement outside 0..1."""
    if out.exists():
        raise BadInput(f"{out} already exists; choose another --out or remove it")
    if not out.parent.is_dir():
        raise BadInput(f"{out.parent}: no such directory for --out")
    if min_agreement is not None and not 0.0 <= min_agreement <= 1.0:
        raise BadInput(f"--min-agreement {min_agreement} must be between 0 and 1")


def convert(opts: Options, front: FrontEnd) -> Result:
    """Quantize ``front``'s source, gate it, and publish the bundle at ``opts.out``; nothing is left on failure."""
    work = Path(tempfile.mkdtemp(dir=opts.out.parent, prefix=f".{opts.out.name}.convert-"))
    try:
        return _convert(opts, front, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _convert(opts: Options, front: FrontEnd, work: Path) -> Result:
    ext = opts.fmt.value
    float_path, bundle = work / f"float.{ext}", work / "bundle"
    bundle.mkdir()
    model_path = bundle / f"model.{ext}"
    route = front.route
    choice = build_quantized(front.source, opts.fmt, opts.quant, front.calibration, opts.calib, work, model_path,
                             nhwc=route.nhwc, onnx_module=route.onnx_module, rounding=opts.rounding, equalize=route.equalize)
    report, ref, test = front.gate(float_path, model_path, ext, opts.min_agreement)
    data = report.to_dict()
    data.update(recipe=choice.quant.value, why=choice.why, rounding=choice.rounding, format=ext,
                calibration_samples=len(front.calibration), **front.describe(choice, ref))
    if not report.passed:
        raise QualityGateFailed(front.failure(choice, report, data))
    extra, spec_extra = front.extras(bundle, work)
    files = [("weights", model_path), *extra]
    name = opts.name or front.source.name
    title = f"{name} {choice.quant.value} {ext}"
    io, arena = write_extras(bundle, files, front.labels, data, (report, ref, test), title, model_path, float_path)
    spec = replace(front.spec, input=io[0], output=io[1], quantization=choice.quant.value, arena_bytes=arena, **spec_extra)
    manifest = make_manifest(front.kind, opts.fmt, name, opts.version or f"{choice.quant.value}-{ext}", files, front.source,
                             {"model": opts.model, "calibration": str(opts.calib)}, data, **{front.kind.value: spec})
    package(bundle, manifest, opts.out)
    return Result(manifest, opts.out, data)
