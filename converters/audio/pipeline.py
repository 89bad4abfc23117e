"""One audio conversion: the source, its front end and the clip sets, handed to the classifier core.

Calibration and evaluation WAVs go through the bundle's own front end (:mod:`runtime.classify.audio_frontend`: read, resample to
the model's rate, windows; :mod:`converters.audio.clips`), so the quantizer sees exactly what the runtime will
feed; an .npz of ready windows (``x``) is taken as it is. :func:`convert` passes them as a
:class:`converters.audio.front.AudioFront` to :func:`converters.classifier.core.convert`, which quantizes, gates
and packages, leaving nothing behind on failure. Without ``--eval``, the gate scores every fifth file of the
calibration folder (every fifth window of an .npz), held out of calibration (:func:`clips.hold_out`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from converters.audio.clips import clip_set, hold_out
from converters.audio.front import AudioFront
from converters.classifier import core
from converters.classifier.core import Result, check_output
from converters.vision.calib import MAX_CALIBRATION
from converters.vision.recipes import Format
from converters.vision.source import Source, SourceKind, load_source
from runtime.bundle.manifest import AudioSpec
from runtime.classify.audio_frontend import FrontEnd, open_frontend
from runtime.errors import BadInput


@dataclass(frozen=True)
class Options(core.Options):
    frontend: FrontEnd | None = None  # default: the zoo model's, else waveform
    frontend_files: tuple[Path, ...] = ()
    sample_rate: int | None = None
    threshold: float = 0.5


def convert(opts: Options) -> Result:
    check_output(opts.out, opts.min_agreement)
    if not 0.0 < opts.threshold < 1.0:
        raise BadInput(f"--threshold {opts.threshold} must be between 0 and 1")
    source, kind, files, rate = _source(opts)
    if source.kind is not SourceKind.TORCH and opts.fmt is Format.TFLITE:
        raise BadInput(
            f"{opts.model}: a {source.kind.value} model converts to ONNX only (litert-torch needs an nn.Module or "
            ".pt2; ONNX -> TFLite needs onnx2tf, which edgerun keeps out); use --format onnx"
        )
    for f in files:
        if not f.is_file():
            raise BadInput(f"{f}: no such front-end model file")
    labels = source.labels
    if opts.labels is not None:
        from runtime.classify.preprocess import read_labels

        labels = read_labels(opts.labels)
    shape = _input_shape(source, kind, files)
    frontend = open_frontend(kind, files, shape)
    try:
        if opts.eval:
            cal = clip_set(opts.calib, frontend, rate, limit=MAX_CALIBRATION).x
            ev = clip_set(opts.eval, frontend, rate, labels)
        else:
            cal, ev = hold_out(clip_set(opts.calib, frontend, rate, limit=MAX_CALIBRATION))
    finally:
        frontend.close()
    spec = AudioSpec(sample_rate=rate, frontend=kind.value, input_shape=shape, output_is_logits=False, threshold=opts.threshold,
                     labels="labels.txt" if labels else None)
    return core.convert(opts, AudioFront(source, labels, spec, cal, ev, files, opts.threshold, opts.eval, opts.calib))


def _source(opts: Options) -> tuple[Source, FrontEnd, list[Path], int]:
    if opts.model.startswith("zoo:"):
        from converters.audio import zoo

        entry = zoo.find(opts.model[4:])
        files = zoo.frontend_files()
        module = zoo.build_head(files[0].parent / entry.head)
        source = Source(SourceKind.TORCH, entry.name, module=module, labels=[entry.label], license=zoo.LICENSE)
        return source, opts.frontend or FrontEnd.OPENWAKEWORD, list(opts.frontend_files) or files, opts.sample_rate or zoo.SAMPLE_RATE
    source = load_source(opts.model)
    if opts.sample_rate is None:
        raise BadInput(f"{opts.model}: give --sample-rate (the rate the model's front end expects, e.g. 16000)")
    return source, opts.frontend or FrontEnd.WAVEFORM, list(opts.frontend_files), opts.sample_rate


def _input_shape(source: Source, kind: FrontEnd, files: list[Path]) -> tuple[int, ...]:
    if kind is FrontEnd.OPENWAKEWORD:
        from runtime.classify.audio_frontend import OWW_EMBEDDING_SIZE, OWW_EMBEDDINGS

        return (OWW_EMBEDDINGS, OWW_EMBEDDING_SIZE)
    if source.kind is SourceKind.ONNX:
        import onnx

        from converters.vision.onnx_route import input_name

        name = input_name(source.onnx_path)  # type: ignore[arg-type]
        graph = onnx.load(str(source.onnx_path), load_external_data=False).graph
        dims = [d.dim_value for d in next(i for i in graph.input if i.name == name).type.tensor_type.shape.dim]
        if len(dims) == 2 and dims[1] > 0:
            return (dims[1],)
    raise BadInput(
        f"{source.name}: a waveform model needs a fixed input of shape (N, SAMPLES); give it as an .onnx "
        "with that input, or use a zoo model"
    )
