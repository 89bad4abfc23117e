"""One vision conversion: the source, its input spec and the image sets, handed to the classifier core.

:func:`convert` reads what only an image model has (the source's route, its input size and layout, the
preprocessing, calibration and evaluation images through :mod:`converters.vision.calib`) and passes them as a
:class:`converters.vision.front.VisionFront` to :func:`converters.classifier.core.convert`, which quantizes,
gates and packages, leaving nothing behind on failure. Without ``--eval``, the gate scores samples held out of
the calibration set (:func:`calib.hold_out`), never the images the quantizer calibrated on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from converters.classifier import core
from converters.classifier.core import Result, Route, check_output
from converters.vision import calib as calibration
from converters.vision.front import VisionFront
from converters.vision.recipes import Format
from converters.vision.source import Source, SourceKind, load_source
from runtime.bundle.manifest import ColorOrder, Layout, ResizeMode, VisionSpec
from runtime.errors import BadInput


@dataclass(frozen=True)
class Options(core.Options):
    equalize: bool = False  # try activation equalization before INT8 (PyTorch sources; --equalize on)
    size: int | None = None
    layout: Layout | None = None  # default: nhwc for TFLite, nchw for ONNX
    mean: tuple[float, ...] | None = None  # pixel units, (pixel - mean) / std
    std: tuple[float, ...] | None = None
    color_order: ColorOrder = ColorOrder.RGB
    resize: ResizeMode = ResizeMode.CENTER_CROP
    calib_limit: int = calibration.MAX_CALIBRATION


def convert(opts: Options) -> Result:
    check_output(opts.out, opts.min_agreement)
    source = load_source(opts.model)
    _check_route(source, opts.fmt)
    if source.kind is SourceKind.ONNX:
        size, layout = _onnx_size_layout(source.onnx_path)  # type: ignore[arg-type]
        if opts.size not in (None, size) or opts.layout not in (None, layout):
            raise BadInput(f"{opts.model}: the ONNX model takes {layout.value} {size}px images, "
                           f"not --size {opts.size} --layout {opts.layout and opts.layout.value}")
        opts = replace(opts, size=size, layout=layout)
    labels = calibration_labels(opts, source)
    spec = _spec(opts, source, "labels.txt" if labels else None)
    shape = (1, 3, spec.size, spec.size) if spec.layout is Layout.NCHW else (1, spec.size, spec.size, 3)
    cal = calibration.load_samples(opts.calib, spec, shape, labels, limit=opts.calib_limit)
    if opts.eval:
        ev = calibration.load_samples(opts.eval, spec, shape, labels)
    else:
        cal, ev = calibration.hold_out(cal)
    route = Route(nhwc=spec.layout is Layout.NHWC, onnx_module=None if source.module is None else _nchw(source.module, spec),
                  equalize=opts.equalize)
    return core.convert(opts, VisionFront(source, labels, spec, cal.x, route, ev, opts.eval, opts.calib))


def calibration_labels(opts: Options, source: Source) -> list[str] | None:
    if opts.labels is not None:
        from runtime.classify.preprocess import read_labels

        return read_labels(opts.labels)
    return source.labels


def _check_route(source: Source, fmt: Format) -> None:
    if fmt is Format.TFLITE and source.kind is SourceKind.ONNX:
        raise BadInput("an ONNX model converts to ONNX only: ONNX -> TFLite needs onnx2tf, which edgerun keeps out "
                       "(it pins old packages and downloads data); use --format onnx")
    if fmt is Format.ONNX and source.kind is SourceKind.KERAS:
        raise BadInput("a Keras model converts to TFLite only: Keras -> ONNX needs tf2onnx, which edgerun keeps out; use --format tflite")
    if fmt is Format.TFLITE and source.kind is SourceKind.TORCHSCRIPT:
        raise BadInput("a TorchScript model converts to ONNX only (litert-torch needs torch.export); use --format onnx, "
                       "or save the model with torch.export.save as .pt2")


def _spec(opts: Options, source: Source, labels_file: str | None) -> VisionSpec:
    size = opts.size or source.size
    if size is None:
        raise BadInput(f"{opts.model}: give --size (the model's square input side in pixels)")
    layout = opts.layout or (Layout.NHWC if opts.fmt is Format.TFLITE else Layout.NCHW)
    if source.kind is SourceKind.KERAS and (layout is Layout.NCHW or (source.size and size != source.size)):
        raise BadInput(f"{opts.model}: the Keras model takes NHWC {source.size}px images, not --size {size} --layout {layout.value}")
    return VisionSpec(size=size, layout=layout, color_order=opts.color_order, resize=opts.resize,
                      mean=opts.mean or source.mean or (0.0,), std=opts.std or source.std or (1.0,), labels=labels_file)


def _onnx_size_layout(path: Path) -> tuple[int | None, Layout | None]:
    """An ONNX source says its own input size and layout (N,3,H,W or N,H,W,3)."""
    import onnx

    from converters.vision.onnx_route import input_name

    name = input_name(path)
    graph = onnx.load(str(path), load_external_data=False).graph
    dims = [d.dim_value for d in next(i for i in graph.input if i.name == name).type.tensor_type.shape.dim]
    if len(dims) == 4 and dims[1] == 3 and dims[2] == dims[3] > 0:
        return dims[2], Layout.NCHW
    if len(dims) == 4 and dims[3] == 3 and dims[1] == dims[2] > 0:
        return dims[1], Layout.NHWC
    raise BadInput(f"{path}: input shape {dims} is not a square RGB image (N,3,S,S or N,S,S,3)")


def _nchw(module: Any, spec: VisionSpec) -> Any:
    """The module the ONNX export takes: the source's own, behind a transpose when the bundle feeds NHWC."""
    if spec.layout is Layout.NCHW:
        return module
    from converters.vision.tflite import nhwc_input

    return nhwc_input(module)
