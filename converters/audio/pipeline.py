"""One audio conversion: source -> float model -> quantized model -> gate -> bundle with its front end.

Calibration and evaluation WAVs go through the bundle's own front end
(:mod:`runtime.audio`: read, resample to the model's rate, windows), so the
quantizer sees exactly what the runtime will feed; an .npz of ready windows
(``x``) is taken as it is. The quantization routes, the gate and the atomic
packaging are the vision converter's (:mod:`converters.vision.pipeline`).
A one-output model is a detector: the gate's top-1 agreement is agreement of
its decisions at the threshold (see :func:`converters.vision.gate.compare`).
Without ``--eval``, the gate scores every fifth file of the calibration folder
(every fifth window of an .npz), held out of calibration (:func:`hold_out`).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from converters.vision import gate
from converters.vision.calib import HOLD_OUT_EVERY, MAX_CALIBRATION, MIN_CALIBRATION
from converters.vision.pipeline import build_quantized, check_output, make_manifest, onnx_peak_bytes, package, write_extras
from converters.vision.recipes import Format, QuantScheme, Rounding
from converters.vision.source import Source, SourceKind, load_source
from runtime.audio import FrontEnd, load_audio, open_frontend, wav_files
from runtime.bundle import AudioSpec, Manifest, ModelKind
from runtime.errors import BadInput, QualityGateFailed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Options:
    model: str
    calib: Path
    out: Path
    quant: QuantScheme = QuantScheme.AUTO
    fmt: Format = Format.TFLITE
    rounding: Rounding = Rounding.GPTQ
    frontend: FrontEnd | None = None  # default: the zoo model's, else waveform
    frontend_files: tuple[Path, ...] = ()
    sample_rate: int | None = None
    labels: Path | None = None
    eval: Path | None = None
    min_agreement: float | None = None  # None: the default gate (converters.vision.gate.default_checks)
    threshold: float = 0.5
    name: str | None = None
    version: str | None = None


@dataclass(frozen=True)
class Result:
    manifest: Manifest
    out: Path
    report: dict[str, Any]


def _source(opts: Options) -> tuple[Source, FrontEnd, list[Path], int, list[str] | None]:
    if opts.model.startswith("zoo:"):
        from converters.audio import zoo

        entry = zoo.find(opts.model[4:])
        files = zoo.frontend_files()
        module = zoo.build_head(files[0].parent / entry.head)
        source = Source(SourceKind.TORCH, entry.name, module=module, labels=[entry.label], license=zoo.LICENSE)
        return source, opts.frontend or FrontEnd.OPENWAKEWORD, list(opts.frontend_files) or files, opts.sample_rate or zoo.SAMPLE_RATE, None
    source = load_source(opts.model)
    if opts.sample_rate is None:
        raise BadInput(f"{opts.model}: give --sample-rate (the rate the model's front end expects, e.g. 16000)")
    return source, opts.frontend or FrontEnd.WAVEFORM, list(opts.frontend_files), opts.sample_rate, None


@dataclass(frozen=True)
class ClipSet:
    x: np.ndarray  # model inputs, one row per window
    clip: np.ndarray | None  # which file each window came from (None for an .npz)
    labels: np.ndarray | None  # per file: class index (detectors: 1 = the word, 0 = anything else), -1 unknown


def clip_set(folder: Path, frontend: Any, rate: int, label_names: list[str] | None = None, limit: int | None = None) -> ClipSet:
    """Model inputs from a folder of WAVs (every window of every file, evenly thinned to ``limit``) or an .npz ``x``.

    WAVs in subfolders are labelled by the subfolder's name: a class name from the labels, or for a one-label
    detector its label (the word is said) or any other name (it is not)."""
    if not folder.exists():
        raise BadInput(f"{folder}: no such calibration/evaluation folder or .npz file")
    clip = labels = None
    if folder.is_file():
        if folder.suffix != ".npz":
            raise BadInput(f"{folder}: give a folder of .wav files or an .npz with an array 'x' of model inputs")
        try:
            with np.load(folder, allow_pickle=False) as data:
                x = np.asarray(data["x"], np.float32)
        except (KeyError, ValueError, OSError) as exc:
            raise BadInput(f"{folder}: not an .npz with an array 'x' ({exc})") from None
    else:
        files = wav_files(folder)
        if not files:
            raise BadInput(f"{folder}: no .wav files (calibration and evaluation sets are folders of WAV files)")
        parts = [frontend.windows(load_audio(f, rate).samples, rate).x for f in files]
        x = np.concatenate(parts)
        clip = np.repeat(np.arange(len(files)), [len(p) for p in parts])
        labels = np.array([_clip_label(f, folder, label_names) for f in files])
    want = tuple(frontend.input_shape)
    if x.ndim < 2 or tuple(x.shape[1:]) != want:
        raise BadInput(f"{folder}: inputs have shape {x.shape[1:]}, the model takes {want}")
    if not np.isfinite(x).all():
        raise BadInput(f"{folder}: inputs contain NaN or infinity")
    if limit is not None and len(x) > limit:
        keep = np.linspace(0, len(x) - 1, limit).round().astype(int)
        x, clip = x[keep], None if clip is None else clip[keep]
    return ClipSet(np.ascontiguousarray(x), clip, labels)


def _clip_label(path: Path, root: Path, names: list[str] | None) -> int:
    if path.parent == root or not names:
        return -1
    name = path.relative_to(root).parts[0]
    if len(names) == 1:
        return int(name == names[0])
    return names.index(name) if name in names else -1


def windows(folder: Path, frontend: Any, rate: int, limit: int | None = None) -> np.ndarray:
    return clip_set(folder, frontend, rate, limit=limit).x


def hold_out(cal: ClipSet, every: int = HOLD_OUT_EVERY) -> tuple[np.ndarray, ClipSet]:
    """(calibration windows, evaluation set) with no --eval: every ``every``-th file goes to evaluation whole (its
    windows overlap, so holding out single windows would score what calibrated), or every ``every``-th window of
    an .npz, or of a folder with too few files to spare one."""
    held = None
    if cal.clip is not None and cal.clip.max() + 1 >= every:
        held = cal.clip % every == every - 1
    if held is None or len(cal.x) - held.sum() < MIN_CALIBRATION:
        held = np.arange(len(cal.x)) % every == every - 1
    if len(cal.x) - held.sum() < MIN_CALIBRATION:
        raise BadInput(
            f"{len(cal.x)} calibration windows are too few to hold {100 // every} % out for the accuracy gate; "
            "give more audio, or an evaluation set with --eval"
        )
    return np.ascontiguousarray(cal.x[~held]), ClipSet(np.ascontiguousarray(cal.x[held]), None, None)


def clip_accuracy(ev: ClipSet, scores: np.ndarray, threshold: float) -> float | None:
    """Labelled files classified right: a detector's best window against the threshold, else the best class over windows."""
    if ev.clip is None or ev.labels is None or not (ev.labels >= 0).any():
        return None
    right = []
    for i, label in enumerate(ev.labels):
        if label < 0:
            continue
        best = scores[ev.clip == i].max(axis=0)
        got = int(best[0] >= threshold) if scores.shape[1] == 1 else int(best.argmax())
        right.append(got == label)
    return float(np.mean(right))


def convert(opts: Options) -> Result:
    out = opts.out
    check_output(out, opts.min_agreement)
    if not 0.0 < opts.threshold < 1.0:
        raise BadInput(f"--threshold {opts.threshold} must be between 0 and 1")
    source, kind, files, rate, _ = _source(opts)
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
        from runtime.preprocess import read_labels

        labels = read_labels(opts.labels)
    work = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.convert-"))
    try:
        return _convert(opts, source, kind, files, rate, labels, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _input_shape(source: Source, kind: FrontEnd, files: list[Path]) -> tuple[int, ...]:
    if kind is FrontEnd.OPENWAKEWORD:
        from runtime.audio import OWW_EMBEDDING_SIZE, OWW_EMBEDDINGS

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


def _convert(opts: Options, source: Source, kind: FrontEnd, files: list[Path], rate: int, labels: list[str] | None, work: Path) -> Result:
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
    ext = opts.fmt.value
    bundle = work / "bundle"
    bundle.mkdir()
    model_path = bundle / f"model.{ext}"
    choice = build_quantized(source, opts.fmt, opts.quant, cal, opts.calib, work, model_path, rounding=opts.rounding)
    float_path = work / f"float.{ext}"
    report, ref, test = gate.run_gate(float_path, model_path, ext, ev.x, None, opts.min_agreement, threshold=opts.threshold)
    if ev.labels is not None and (ev.labels >= 0).any():  # accuracy per labelled file, not per window; the gate checks it
        report = replace(
            report,
            labelled=int((ev.labels >= 0).sum()),
            accuracy_float=clip_accuracy(ev, ref, opts.threshold),
            accuracy_quant=clip_accuracy(ev, test, opts.threshold),
        )
    data = report.to_dict()
    held = (
        f"held out of --calib {opts.calib} (every {HOLD_OUT_EVERY}th file, or window of an .npz; they did not calibrate): no --eval given"
    )
    data.update(
        recipe=choice.quant.value,
        why=choice.why,
        rounding=choice.rounding,
        format=ext,
        calibration_samples=len(cal),
        sample_rate=rate,
        frontend=kind.value,
        evaluation=f"--eval {opts.eval}" if opts.eval else held,
    )
    if not report.passed:
        raise QualityGateFailed(
            f"accuracy gate failed on {report.samples} windows, {data['evaluation']}: {report.verdict()} "
            f"(max abs error {report.max_abs_error:.3g}); nothing was written. "
            "Try more representative --calib audio, or --quant fp16"
        )
    entries = [("weights", model_path)]
    for i, f in enumerate(files):
        dst = bundle / f"frontend-{i}-{f.name}"
        shutil.copyfile(f, dst)
        entries.append(("frontend", dst))
    title = f"{opts.name or source.name} {choice.quant.value} {ext}"
    io, arena = write_extras(bundle, entries, labels, data, (report, ref, test), title, model_path, float_path)
    spec = AudioSpec(
        sample_rate=rate,
        frontend=kind.value,
        input_shape=shape,
        frontend_files=tuple(p.name for role, p in entries if role == "frontend"),
        input=io[0],
        output=io[1],
        output_is_logits=False,
        threshold=opts.threshold,
        labels="labels.txt" if labels else None,
        quantization=choice.quant.value,
        arena_bytes=arena,
        frontend_arena_bytes=_frontend_arena(kind, files, work),
    )
    manifest = make_manifest(
        ModelKind.AUDIO,
        opts.fmt,
        opts.name or source.name,
        opts.version or f"{choice.quant.value}-{ext}",
        entries,
        source,
        {"model": opts.model, "calibration": str(opts.calib)},
        data,
        audio=spec,
    )
    package(bundle, manifest, opts.out)
    return Result(manifest, opts.out, data)


def _frontend_arena(kind: FrontEnd, files: list[Path], work: Path) -> int:
    """The front end's activation peak per call, at the chunk sizes runtime.audio uses (for the memory plan)."""
    if kind is not FrontEnd.OPENWAKEWORD:
        return 0
    from runtime.audio import OWW_EMBEDDING_BATCH, OWW_FFT_SAMPLES, OWW_HOP_SAMPLES, OWW_MEL_CHUNK_FRAMES, OWW_MEL_WINDOW

    mel = onnx_peak_bytes(files[0], [1, (OWW_MEL_CHUNK_FRAMES - 1) * OWW_HOP_SAMPLES + OWW_FFT_SAMPLES], work)
    return mel + onnx_peak_bytes(files[1], [OWW_EMBEDDING_BATCH, OWW_MEL_WINDOW, 32, 1], work)
