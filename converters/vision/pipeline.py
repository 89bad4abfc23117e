"""One vision conversion, start to finish: source -> float model -> quantized model -> gate -> bundle.

Everything is written under a temporary directory beside ``--out`` and becomes
visible only at the end, by one rename (bundle directory) or by
:func:`runtime.store.pack` (``.edgerun`` file, itself temp + rename). Any failure,
including a failed accuracy gate (:class:`runtime.errors.QualityGateFailed`, exit 7),
removes the temporary directory: nothing is left behind. Without ``--eval``, the gate
scores samples held out of the calibration set (:func:`calib.hold_out`), never the
images the quantizer calibrated on.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from converters.vision import calib as calibration
from converters.vision import gate
from converters.vision.recipes import Choice, Format, QuantScheme, Rounding, choose
from converters.vision.source import Source, SourceKind, load_source
from devices.backends import for_format
from runtime.bundle import ColorOrder, FileEntry, Layout, Manifest, ModelKind, ResizeMode, VisionSpec, check_name, check_version
from runtime.errors import BadInput, QualityGateFailed
from runtime.files import sha256_file
from runtime.preprocess import log_softmax
from runtime.store import publish

log = logging.getLogger(__name__)
# An equalized INT8 candidate replaces the model as is only below this fraction of its calibration KL: on
# EfficientNet-Lite0 the best candidate came within 6-8 % of it (0.00287 vs 0.00312) and agreed less with float
# on the evaluation set (90 vs 93.5 %); on MobileNetV2 it was 0.35-0.37 of it and agreed more (89 vs 80 %).
EQUALIZE_MARGIN = 0.8


@dataclass(frozen=True)
class Options:
    model: str
    calib: Path
    out: Path
    quant: QuantScheme = QuantScheme.AUTO
    fmt: Format = Format.TFLITE
    rounding: Rounding = Rounding.GPTQ
    equalize: bool = False  # try activation equalization before INT8 (PyTorch sources; --equalize on)
    size: int | None = None
    layout: Layout | None = None  # default: nhwc for TFLite, nchw for ONNX
    mean: tuple[float, ...] | None = None  # pixel units, (pixel - mean) / std
    std: tuple[float, ...] | None = None
    color_order: ColorOrder = ColorOrder.RGB
    resize: ResizeMode = ResizeMode.CENTER_CROP
    labels: Path | None = None
    eval: Path | None = None
    min_agreement: float | None = None  # None: the default gate (converters.vision.gate.default_checks)
    name: str | None = None
    version: str | None = None
    calib_limit: int = calibration.MAX_CALIBRATION


@dataclass(frozen=True)
class Result:
    manifest: Manifest
    out: Path
    report: dict[str, Any]


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


def _onnx_size_layout(path: Path, opts: Options) -> tuple[int | None, Layout | None]:
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


def convert(opts: Options) -> Result:
    out = opts.out
    check_output(out, opts.min_agreement)
    source = load_source(opts.model)
    _check_route(source, opts.fmt)
    if source.kind is SourceKind.ONNX:
        size, layout = _onnx_size_layout(source.onnx_path, opts)  # type: ignore[arg-type]
        if opts.size not in (None, size) or opts.layout not in (None, layout):
            raise BadInput(f"{opts.model}: the ONNX model takes {layout.value} {size}px images, "
                           f"not --size {opts.size} --layout {opts.layout and opts.layout.value}")
        opts = Options(**{**opts.__dict__, "size": size, "layout": layout})
    labels = calibration_labels(opts, source)
    work = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.convert-"))
    try:
        return _convert(opts, source, labels, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def check_output(out: Path, min_agreement: float | None) -> None:
    """Refusals before any work: an existing --out, a missing parent directory, an agreement outside 0..1."""
    if out.exists():
        raise BadInput(f"{out} already exists; choose another --out or remove it")
    if not out.parent.is_dir():
        raise BadInput(f"{out.parent}: no such directory for --out")
    if min_agreement is not None and not 0.0 <= min_agreement <= 1.0:
        raise BadInput(f"--min-agreement {min_agreement} must be between 0 and 1")


def calibration_labels(opts: Options, source: Source) -> list[str] | None:
    if opts.labels is not None:
        from runtime.preprocess import read_labels

        return read_labels(opts.labels)
    return source.labels


def _convert(opts: Options, source: Source, labels: list[str] | None, work: Path) -> Result:
    spec = _spec(opts, source, "labels.txt" if labels else None)
    shape = (1, 3, spec.size, spec.size) if spec.layout is Layout.NCHW else (1, spec.size, spec.size, 3)
    cal = calibration.load_samples(opts.calib, spec, shape, labels, limit=opts.calib_limit)
    if opts.eval:
        ev = calibration.load_samples(opts.eval, spec, shape, labels)
    else:
        cal, ev = calibration.hold_out(cal)
    ext = opts.fmt.value
    float_path, bundle = work / f"float.{ext}", work / "bundle"
    bundle.mkdir()
    model_path = bundle / f"model.{ext}"
    onnx_module = None if source.module is None else _nchw(source.module, spec)
    choice = build_quantized(source, opts.fmt, opts.quant, cal.x, opts.calib, work, model_path,
                             nhwc=spec.layout is Layout.NHWC, onnx_module=onnx_module, rounding=opts.rounding,
                             equalize=opts.equalize)
    report, ref, test = gate.run_gate(float_path, model_path, ext, ev.x, ev.labels, opts.min_agreement,
                                      noisy_x=noisy_inputs(ev.x, spec))
    data = _report(opts, choice, report, len(cal.x), source, ev, ref)
    if not report.passed:
        raise QualityGateFailed(
            f"accuracy gate failed on {report.samples} {data['evaluation']}: {report.verdict()} (top-1 agreement "
            f"{report.top1_agreement:.2%} on all samples, cosine min {report.cosine_min:.4f}; the float model agrees "
            f"{report.float_self_agreement:.2%} with itself under +-1 grey level of noise on this set); "
            f"nothing was written. Try {_remedies(opts, choice, source)}")
    files = [("weights", model_path)]
    title = f"{opts.name or source.name} {choice.quant.value} {ext}"
    io, arena = write_extras(bundle, files, labels, data, (report, ref, test), title, model_path, float_path)
    spec = VisionSpec(**{**spec.__dict__, "input": io[0], "output": io[1], "quantization": choice.quant.value, "arena_bytes": arena})
    manifest = make_manifest(ModelKind.VISION, opts.fmt, opts.name or source.name, opts.version or f"{choice.quant.value}-{ext}",
                             files, source, {"model": opts.model, "calibration": str(opts.calib)}, data, vision=spec)
    package(bundle, manifest, opts.out)
    return Result(manifest, opts.out, data)


def _remedies(opts: Options, choice: Choice, source: Source) -> str:
    """What a user can try after a failed gate, only the options that apply to this conversion."""
    tries = ["more or more representative --calib data"]
    if choice.quant is QuantScheme.INT8 and source.module is not None and not opts.equalize:
        from converters.vision.equalize import applicable

        if applicable(source.module):
            tries.append("--equalize on (evens out activation ranges across channels before INT8)")
    if choice.quant is not QuantScheme.FP16:
        tries.append("--quant fp16")
    return ", ".join(tries[:-1]) + f", or {tries[-1]}" if len(tries) > 1 else tries[0]


def write_extras(bundle: Path, files: list[tuple[str, Path]], labels: list[str] | None, data: dict[str, Any],
                 gated: tuple[gate.GateReport, np.ndarray, np.ndarray], title: str, model_path: Path,
                 float_path: Path) -> tuple[tuple[Any, Any], int]:
    """labels.txt, report.json and report.png into ``bundle`` (appended to ``files`` with their roles); then the
    quantized model's input/output quantization and its measured arena bytes."""
    if labels:
        (bundle / "labels.txt").write_text("\n".join(labels) + "\n", encoding="utf-8")
        files.append(("labels", bundle / "labels.txt"))
    (bundle / "report.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    files.append(("report", bundle / "report.json"))
    if gate.plot(*gated, title, bundle / "report.png"):
        files.append(("report-plot", bundle / "report.png"))
    ext = model_path.suffix[1:]
    with gate.open_model(model_path, ext) as backend:
        return (gate.tensor_quant(backend.input), gate.tensor_quant(backend.output)), _arena_bytes(backend, float_path, ext)


def make_manifest(kind: ModelKind, fmt: Format, name: str, version: str, files: list[tuple[str, Path]], source: Source,
                  origin: dict[str, str], data: dict[str, Any], **spec: Any) -> Manifest:
    return Manifest(
        kind=kind, backend=for_format(fmt.value).name, model_format=fmt.value, name=check_name(name), version=check_version(version),
        files=tuple(FileEntry(p.name, *sha256_file(p), role=role) for role, p in files), license=source.license,
        source={**origin, "route": f"{source.kind.value}->{fmt.value}"}, reports={"accuracy": data}, **spec,
    )


def build_quantized(source: Source, fmt: Format, quant: QuantScheme, cal_x: np.ndarray, calib: Path, work: Path, model_path: Path,
                    *, nhwc: bool = False, onnx_module: Any = None, rounding: Rounding = Rounding.NEAREST,
                    equalize: bool = False) -> Choice:
    """Float model from ``source`` at ``work/float.EXT``, then the chosen recipe into ``model_path``; the choice made.

    ``nhwc`` puts a layout transpose in front of a PyTorch module for TFLite; ``onnx_module`` is the module the
    ONNX export takes (default: the source's own). With the INT8 recipe, a copy of the module is prepared for the
    quantizer: weights GPTQ-rounded (``rounding``) and exported again as ``work/prepared-N.EXT``, which the
    quantizer takes. With ``equalize``, copies with activation ranges equalized across channels
    (converters.vision.equalize.CONFIGS) are prepared and quantized too, and the INT8 model closest to float on the
    calibration set is kept; the report's ``equalization`` says which and by how much. ``float.EXT`` stays the
    unchanged float model the gate compares against.
    """
    ext = fmt.value
    float_path = work / f"float.{ext}"
    export_module = onnx_module if onnx_module is not None else source.module
    if fmt is Format.TFLITE:
        from converters.vision import tflite as route

        if source.module is not None and nhwc:
            export_module = route.nhwc_input(source.module)
        if source.kind is SourceKind.KERAS:
            route.export_keras(source.keras_path, float_path, work)  # type: ignore[arg-type]
        else:
            route.export_float(export_module, cal_x, float_path, nhwc=False)
    else:
        from converters.vision import onnx_route as route  # type: ignore[no-redef]

        if source.kind is SourceKind.ONNX:
            route.copy_float(source.onnx_path, float_path)  # type: ignore[arg-type]
        else:
            route.export_float(export_module, cal_x, float_path)
    choice = choose(quant, route.op_census(float_path))
    if choice.quant is QuantScheme.INT8:
        calibration.check_calibration(calibration.Samples(cal_x, None, ()), calib)
    log.info("recipe %s: %s", choice.quant.value, choice.why)
    if choice.quant is not QuantScheme.INT8:
        _quantize(route, fmt, float_path, choice.quant, cal_x, model_path, work)
        return choice
    candidates: list[tuple[str, Any, dict[str, Any]]] = [("as is", export_module, {})]
    if source.module is None:
        summary: dict[str, Any] = {"applied": False, "why": f"equalization needs a PyTorch module, the source is {source.kind.value}"}
    elif not equalize:
        summary = {"applied": False, "why": "off (--equalize on tries it)"}
    else:
        from converters.vision.equalize import CONFIGS
        from converters.vision.equalize import equalize as equalize_channels

        for tag, alpha, streams in CONFIGS:  # a model may have streams and no depthwise input, or the reverse
            rewritten, summary = equalize_channels(export_module, cal_x, alpha=alpha, smooth_streams=streams)
            if rewritten is not None:
                candidates.append((tag, rewritten, summary))
    built = []
    for i, (tag, module, done) in enumerate(candidates):
        prepared, rounded_summary = module, choice.rounding
        if rounding is Rounding.GPTQ:
            rounded_summary, rounded = _gptq(source, module, cal_x)
            prepared = rounded if rounded is not None else module
        quantize_from = float_path
        if prepared is not export_module:
            quantize_from = work / f"prepared-{i}.{ext}"
            route.export_float(prepared, cal_x, quantize_from, **({"nhwc": False} if fmt is Format.TFLITE else {}))
        out = model_path if len(candidates) == 1 else work / f"int8-{i}.{ext}"
        _quantize(route, fmt, quantize_from, choice.quant, cal_x, out, work)
        built.append((tag, rounded_summary, out, done))
    if len(built) > 1:
        # Equalization helps models with uneven channel ranges (MobileNetV2) and can cost a little where they are
        # already even (EfficientNet-Lite0), and how far to move range into the weights differs by model: every
        # candidate is quantized, and the one closest to float on the calibration set replaces the model as is
        # if it cuts the KL by the margin (the evaluation set stays for the gate alone).
        with gate.open_model(float_path, ext) as model:
            ref = gate.outputs(model, cal_x)
        kl = {b[0]: _calibration_kl(ref, b[2], ext, cal_x) for b in built}
        best = min(built[1:], key=lambda b: kl[b[0]])
        if not kl[best[0]] < EQUALIZE_MARGIN * kl["as is"]:
            best = built[0]
        summary = {**best[3], "applied": best[0] != "as is", "kept": best[0],
                   "calibration_kl": {t: round(v, 6) for t, v in kl.items()}}
        if not summary["applied"]:
            summary["why"] = f"no equalized candidate cut the calibration KL below {EQUALIZE_MARGIN:.0%} of the model as is"
        best[2].rename(model_path)
        built = [best]
    return replace(choice, equalization=summary, rounding=built[0][1])


def _quantize(route: Any, fmt: Format, src: Path, quant: QuantScheme, cal_x: np.ndarray, out: Path, work: Path) -> None:
    if fmt is Format.TFLITE:
        route.quantize(src, quant, cal_x, out)
    else:
        route.quantize(src, quant, cal_x, out, work)


def _calibration_kl(ref: np.ndarray, quant_path: Path, ext: str, x: np.ndarray) -> float:
    """Mean KL divergence of the quantized model's softmax over ``x`` from the float model's (``ref``: its outputs);
    squared error for a single-output model, whose output is a score, not logits."""
    with gate.open_model(quant_path, ext) as model:
        test = gate.outputs(model, x)
    if ref.shape[1] == 1:
        return float(np.mean((ref.astype(np.float64) - test) ** 2))
    log_p, log_q = log_softmax(ref), log_softmax(test)
    return float((np.exp(log_p) * (log_p - log_q)).sum(1).mean())


def _gptq(source: Source, module: Any, cal_x: np.ndarray) -> tuple[dict[str, Any], Any]:
    """GPTQ-rounded copy of ``module`` (which takes ``cal_x`` as it is), or why rounding stays nearest."""
    from converters.vision import rounding

    if source.module is None:
        return {"method": Rounding.NEAREST.value, "why": f"GPTQ needs a PyTorch module, the source is {source.kind.value}"}, None
    if not rounding.has_layers(module):
        return {"method": Rounding.NEAREST.value,
                "why": "no Conv2d/Linear modules to round (an ExportedProgram or TorchScript file keeps only its graph)"}, None
    rounded = copy.deepcopy(module)
    summary = rounding.round_weights(rounded, cal_x)
    log.info("GPTQ rounded %d layers in %.1f s", summary["layers"], summary["seconds"])
    return summary, rounded if summary["layers"] else None  # none rounded: quantize the float model as it is


def package(bundle: Path, manifest: Manifest, out: Path) -> None:
    """Write the manifest into the finished ``bundle`` directory and publish it at ``out`` (runtime.store.publish)."""
    (bundle / "manifest.json").write_bytes(manifest.to_json())
    publish(bundle, out)


def noisy_inputs(x: np.ndarray, spec: VisionSpec, seed: int = 0) -> np.ndarray:
    """``x`` with every pixel moved by -1, 0 or +1 grey level at random. The float model's top-1 agreement with
    itself over these is the noise floor under the gate's agreement on this evaluation set (no quantized model
    can be asked to beat what an invisible change does to the float one); the samples it leaves unchanged are
    the ones whose float decision means something (:func:`gate.agreement_where_stable`)."""
    std = np.asarray(spec.std, np.float32)
    shape = (1, -1, 1, 1) if spec.layout is Layout.NCHW else (1, 1, 1, -1)
    noise = np.random.default_rng(seed).integers(-1, 2, x.shape).astype(np.float32) / std.reshape(shape)
    return (x + noise).astype(np.float32)


def _nchw(module: Any, spec: VisionSpec) -> Any:
    if spec.layout is Layout.NCHW:
        return module
    from converters.vision.tflite import nhwc_input

    return nhwc_input(module)


def _arena_bytes(backend: Any, float_path: Path, ext: str) -> int:
    """Activation bytes at batch 1 for the planner.

    TFLite: every non-constant tensor (an upper bound: measured peak RSS came out 0.6-0.8x of the plan; the peak
    of tensors alive at once under-counted it, XNNPACK keeping packed weights and workspaces besides).
    ONNX: the peak of tensors alive at once (runtime.vision_plan.peak_live_bytes) over ORT's own basic-optimized
    graph at batch 1, where every shape is known (the exported graph can compute pads from shapes at run time).
    """
    if ext == "tflite":
        return int(backend.tensor_bytes())
    return onnx_peak_bytes(float_path, None, float_path.parent)


def onnx_peak_bytes(path: Path, shape: list[int] | None, work: Path) -> int:
    """Peak activation bytes of an ONNX model with its one input fixed to ``shape`` (default: batch 1)."""
    import onnx
    import onnxruntime
    from onnx import helper

    from runtime.vision_plan import peak_live_bytes

    model = onnx.load(str(path))
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        for i, d in enumerate(dims):
            if shape is not None:
                d.dim_value = shape[i]
            elif i == 0 and d.dim_param:
                d.dim_value = 1
    stem = work / f".{path.stem}"
    fixed, optimized = stem.with_suffix(".fixed.onnx"), stem.with_suffix(".basic.onnx")
    onnx.save(model, str(fixed))
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(optimized)
    options.log_severity_level = 3
    onnxruntime.InferenceSession(str(fixed), options, providers=["CPUExecutionProvider"])
    inferred = onnx.shape_inference.infer_shapes(onnx.load(str(optimized)))
    fixed.unlink()
    optimized.unlink()
    inits = {i.name for i in inferred.graph.initializer}
    sizes: dict[str, int] = {}
    for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        t = value.type.tensor_type
        if value.name in inits or not t.elem_type:
            continue
        dims = [d.dim_value if d.dim_value > 0 else 1 for d in t.shape.dim]
        sizes[value.name] = int(np.prod(dims)) * np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)).itemsize
    steps = [(list(n.input), list(n.output)) for n in inferred.graph.node]
    return peak_live_bytes(steps, sizes, [i.name for i in inferred.graph.input], [o.name for o in inferred.graph.output])


def evaluation_line(eval_set: Path | None, calib: Path) -> str:
    """What the gate scored, for the report and the CLI: the --eval set, or the samples held out of --calib."""
    if eval_set is not None:
        return f"samples of --eval {eval_set}"
    return (f"samples held out of --calib {calib} (every {calibration.HOLD_OUT_EVERY}th, "
            f"{100 // calibration.HOLD_OUT_EVERY} %; they did not calibrate): no --eval given")


def _report(opts: Options, choice: Choice, report: gate.GateReport, n_cal: int, source: Source, ev: Any, ref: np.ndarray) -> dict[str, Any]:
    data = report.to_dict()
    data.update(recipe=choice.quant.value, why=choice.why, rounding=choice.rounding, equalization=choice.equalization,
                format=opts.fmt.value, calibration_samples=n_cal, evaluation=evaluation_line(opts.eval, opts.calib))
    if source.module is not None:
        data["conversion"] = _parity(source.module, ev.x, ref, opts)
    return data


def _parity(module: Any, x: np.ndarray, ref: np.ndarray, opts: Options) -> dict[str, float]:
    """The float converted model against the source framework's own outputs (conversion error, not quantization)."""
    import torch

    nchw = x if (opts.layout or (Layout.NHWC if opts.fmt is Format.TFLITE else Layout.NCHW)) is Layout.NCHW else np.moveaxis(x, -1, 1)
    with torch.no_grad():
        # one row at a time: an ExportedProgram keeps the batch size it was exported with
        src = np.concatenate([module(torch.from_numpy(np.ascontiguousarray(nchw[i : i + 1]))).numpy() for i in range(len(nchw))])
    src = src.reshape(len(x), -1)
    m = gate.compare(src, ref, None)
    return {"top1_agreement": m["top1_agreement"], "cosine_min": m["cosine_min"], "max_abs_error": m["max_abs_error"]}
