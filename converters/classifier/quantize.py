"""The quantize step: the float model from a source, then the recipe's quantized model, searching candidates for INT8.

Both routes live in converters.vision (:mod:`converters.vision.tflite`, :mod:`converters.vision.onnx_route`);
any classifier uses them. For INT8, each candidate (the model as is, and with ``equalize`` its
activation-equalized copies) is GPTQ-rounded and quantized, and the one closest to float on the calibration set
is kept (:func:`build_quantized`).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from converters.vision import calib as calibration
from converters.vision import gate
from converters.vision.recipes import Choice, Format, QuantScheme, Rounding, choose
from converters.vision.source import Source, SourceKind
from runtime.classify.preprocess import log_softmax

log = logging.getLogger(__name__)
# An equalized INT8 candidate replaces the model as is only below this fraction of its calibration KL: on
# EfficientNet-Lite0 the best candidate came within 6-8 % of it (0.00287 vs 0.00312) and agreed less with float
# on the evaluation set (90 vs 93.5 %); on MobileNetV2 it was 0.35-0.37 of it and agreed more (89 vs 80 %).
EQUALIZE_MARGIN = 0.8


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
