"""The TFLite route: torch module -> float .tflite (litert-torch) -> quantized .tflite (ai-edge-quantizer).

Recipes (``QuantScheme``): ``int8`` is full-integer static INT8 (int8 activations and
per-channel int8 weights, calibrated); ``int4w`` is dynamic INT4 weights
(per-channel; activations quantized on the fly); ``fp16`` casts weights to
float16. Calibration keeps each tensor's global min/max over all samples:
ai-edge-quantizer's default moving average (factor 0.95) forgets all but the
last ~20 samples and clipped MobileNetV2's activations enough to flip 3 of 8
photos' top-1 labels here.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

from converters.vision.recipes import QuantScheme
from runtime.errors import BadInput, require

log = logging.getLogger(__name__)


def nhwc_input(module: Any) -> Any:
    """``module`` (which takes NCHW) behind a transpose, so that it takes NHWC images."""
    import torch

    class ChannelsLast(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: Any) -> Any:
            return self.inner(x.permute(0, 3, 1, 2))

    wrapped = ChannelsLast(module)
    wrapped.training = False  # not .eval(): an ExportedProgram's module refuses train()/eval(); the source is in eval mode
    return wrapped


def export_float(module: Any, example: np.ndarray, out: Path, nhwc: bool) -> None:
    """Write the float model; ``nhwc`` puts a layout transpose in front so the file takes NHWC images."""
    torch = require("torch", "pip install torch==2.13.0", purpose="the TFLite route")
    litert_torch = require("litert_torch", "pip install litert-torch==0.10.0", purpose="the TFLite route")
    model = nhwc_input(module) if nhwc else module
    x = torch.from_numpy(example[:1])
    # litert-torch reports progress on stdout; stdout carries edgerun's data (--json), so send it to stderr.
    with contextlib.redirect_stdout(sys.stderr):
        try:
            converted = litert_torch.convert(model, (x,))
        except Exception as exc:
            raise BadInput(_unsupported(exc)) from None
        converted.export(str(out))


def _tensorflow():
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up chatter
    return require("tensorflow", "pip install tensorflow-cpu==2.21.0", purpose="the TFLite route")


def _saved_model(path: Path, work: Path) -> Path:
    """A SavedModel directory for ``path`` (a .keras file is exported into ``work`` first)."""
    if path.is_dir():
        return path
    tf = _tensorflow()
    try:
        model = tf.keras.models.load_model(str(path), compile=False)
    except Exception as exc:
        raise BadInput(f"{path}: not a loadable Keras model ({type(exc).__name__}: {str(exc)[:300]})") from None
    out = work / "saved_model"
    with contextlib.redirect_stdout(sys.stderr):
        model.export(str(out), format="tf_saved_model")
    return out


def keras_input_size(path: Path) -> int | None:
    """The square side of a Keras model's NHWC image input, or None when it is not fixed."""
    import tempfile

    tf = _tensorflow()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            loaded = tf.saved_model.load(str(_saved_model(path, Path(tmp))))
            fn = loaded.signatures["serving_default"]
        except (KeyError, OSError, ValueError) as exc:
            raise BadInput(f"{path}: not a SavedModel with a serving_default signature ({type(exc).__name__}: {str(exc)[:200]})") from None
        specs = list(fn.structured_input_signature[1].values())
    if len(specs) != 1:
        raise BadInput(f"{path}: a classifier takes one input; the model takes {len(specs)}")
    dims = specs[0].shape.as_list()
    if len(dims) != 4 or dims[3] != 3:
        raise BadInput(f"{path}: input shape {dims} is not an NHWC RGB image (N, S, S, 3)")
    return dims[1] if dims[1] == dims[2] and dims[1] else None


def export_keras(path: Path, out: Path, work: Path) -> None:
    """Keras (.keras or SavedModel directory) -> float .tflite with TensorFlow's own converter."""
    tf = _tensorflow()
    converter = tf.lite.TFLiteConverter.from_saved_model(str(_saved_model(path, work)))
    with contextlib.redirect_stdout(sys.stderr):
        try:
            out.write_bytes(converter.convert())
        except Exception as exc:
            raise BadInput(f"{path}: TensorFlow cannot convert this model to TFLite ({type(exc).__name__}: {str(exc)[:300]})") from None


def _unsupported(exc: Exception) -> str:
    text = str(exc)
    op = re.search(r"(aten\.[A-Za-z0-9_.]+|[A-Za-z0-9_]+ is not supported|unsupported op[^\n]*)", text)
    what = op.group(1) if op else f"{type(exc).__name__}: {text[:300]}"
    return f"litert-torch cannot convert this model to TFLite ({what}); the ONNX route (--format onnx) may take it"


def quantize(float_path: Path, quant: QuantScheme, calib: np.ndarray | None, out: Path) -> None:
    aeq = require("ai_edge_quantizer", "pip install ai-edge-quantizer==0.10.0", purpose="the TFLite route")
    from ai_edge_quantizer import calibrator, quantizer, recipe
    from ai_edge_quantizer.utils import qsv_utils

    q = quantizer.Quantizer(str(float_path))
    if quant is QuantScheme.INT8:
        q.load_quantization_recipe(recipe.static_wi8_ai8())
    elif quant is QuantScheme.INT4W:
        q.load_quantization_recipe(recipe.dynamic_wi4_afp32())
    elif quant is QuantScheme.FP16:
        q.add_weight_only_config(regex=".*", operation_name=aeq.qtyping.TFLOperationName.ALL_SUPPORTED, num_bits=16,
                                 algorithm_key=quantizer.AlgorithmName.FLOAT_CASTING)
    else:
        raise BadInput(f"quantization {quant.value!r} is not valid for TFLite (valid: {', '.join(q.value for q in QuantScheme)})")
    result: dict[str, Any] = {}
    if q.need_calibration:
        assert calib is not None
        signature = _signature(float_path)
        name, inp = signature
        # Quantizer.calibrate offers no update function; the Calibrator it wraps does (see the module docstring).
        cal = calibrator.Calibrator(q._float_model_buffer, num_threads=1, qsv_update_func=qsv_utils.min_max_update)
        cal.calibrate({name: [{inp: calib[i : i + 1]} for i in range(len(calib))]}, q._recipe_manager)
        result = cal.get_model_qsvs()
    with contextlib.redirect_stdout(sys.stderr):  # the quantizer prints its summary
        out.write_bytes(bytes(q.quantize(result).quantized_model))


def _signature(path: Path) -> tuple[str, str]:
    from ai_edge_litert.interpreter import Interpreter

    sigs = Interpreter(model_path=str(path)).get_signature_list()
    if len(sigs) != 1:
        raise BadInput(f"{path}: expected one signature, found {list(sigs)}")
    name, io = next(iter(sigs.items()))
    if len(io["inputs"]) != 1:
        raise BadInput(f"{path}: a classifier takes one input; the model takes {io['inputs']}")
    return name, io["inputs"][0]


def op_census(path: Path) -> dict[str, int]:
    """Op name -> count in a .tflite (for the recipe choice)."""
    from ai_edge_litert.interpreter import Interpreter

    counts: dict[str, int] = {}
    for op in Interpreter(model_path=str(path))._get_ops_details():
        counts[op["op_name"]] = counts.get(op["op_name"], 0) + 1
    return counts
