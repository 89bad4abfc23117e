"""The ONNX route: torch module (or an .onnx file) -> float .onnx -> quantized .onnx (onnxruntime.quantization).

``int8`` is static QDQ with uint8 activations and per-channel int8 weights
(int8/int8 measured 2x slower here), calibrated with MinMax after
``quant_pre_process`` (shape inference and graph optimization; needs sympy);
``int4w`` writes MatMulNBits nodes (4-bit blockwise weights of MatMul/Gemm; needs
onnx-ir); ``fp16`` converts weights and compute to float16 keeping float32
inputs and outputs.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from converters.vision.recipes import QuantScheme
from runtime.errors import BadInput, require

log = logging.getLogger(__name__)
OPSET = 17
INPUT, OUTPUT = "input", "scores"


def export_float(module: Any, example: np.ndarray, out: Path) -> None:
    torch = require("torch", "pip install torch==2.13.0", purpose="the ONNX route")
    require("onnx", "pip install onnx==1.23.2", purpose="the ONNX route")
    with contextlib.redirect_stdout(sys.stderr), torch.no_grad():
        try:
            torch.onnx.export(module, (torch.from_numpy(example[:1]),), str(out), input_names=[INPUT], output_names=[OUTPUT],
                              dynamic_axes={INPUT: {0: "batch"}, OUTPUT: {0: "batch"}}, opset_version=OPSET, dynamo=False,
                              training=torch.onnx.TrainingMode.PRESERVE)  # the source is in eval mode; an ExportedProgram refuses train()
        except Exception as exc:
            raise BadInput(f"torch.onnx cannot export this model ({type(exc).__name__}: {str(exc)[:300]})") from None


def copy_float(src: Path, out: Path) -> None:
    shutil.copyfile(src, out)


def op_census(path: Path) -> dict[str, int]:
    onnx = require("onnx", "pip install onnx==1.23.2", purpose="the ONNX route")
    counts: dict[str, int] = {}
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def input_name(path: Path) -> str:
    onnx = require("onnx", "pip install onnx==1.23.2", purpose="the ONNX route")
    graph = onnx.load(str(path), load_external_data=False).graph
    inits = {i.name for i in graph.initializer}
    names = [i.name for i in graph.input if i.name not in inits]
    if len(names) != 1:
        raise BadInput(f"{path}: a classifier takes one input; the model takes {names}")
    return names[0]


def quantize(float_path: Path, quant: QuantScheme, calib: np.ndarray | None, out: Path, work: Path) -> None:
    quantization = require("onnxruntime.quantization", "pip install onnxruntime==1.32.0 sympy onnx-ir", purpose="the ONNX route")
    if quant is QuantScheme.INT8:
        assert calib is not None
        from onnxruntime.quantization.shape_inference import quant_pre_process

        pre = work / "preprocessed.onnx"
        quant_pre_process(str(float_path), str(pre))
        name = input_name(pre)

        class Reader(quantization.CalibrationDataReader):
            def __init__(self) -> None:
                self.i = 0

            def get_next(self) -> dict[str, np.ndarray] | None:
                if self.i >= len(calib):
                    return None
                self.i += 1
                return {name: calib[self.i - 1 : self.i]}

        quantization.quantize_static(str(pre), str(out), Reader(), quant_format=quantization.QuantFormat.QDQ,
                                     activation_type=quantization.QuantType.QUInt8, weight_type=quantization.QuantType.QInt8,
                                     per_channel=True, calibrate_method=quantization.CalibrationMethod.MinMax)
    elif quant is QuantScheme.INT4W:
        require("onnx_ir", "pip install onnx-ir", purpose="the ONNX route")
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        onnx = require("onnx", "pip install onnx==1.23.2", purpose="the ONNX route")
        model = onnx.load(str(float_path))
        _gemm_to_matmul(model.graph)  # MatMulNBits takes MatMul only; torch exports Linear as Gemm
        if not any(n.op_type == "MatMul" for n in model.graph.node):
            raise BadInput("int4w for ONNX quantizes MatMul/Gemm weights, and this model has none; use --quant int8")
        q = MatMulNBitsQuantizer(model, block_size=32, is_symmetric=True)
        q.process()
        if not any(n.op_type == "MatMulNBits" for n in q.model.model.graph.node):
            raise BadInput("int4w: no MatMul weight could be quantized to 4 bits (inner dimensions below the block of 32?); "
                           "use --quant int8")
        q.model.save_model_to_file(str(out), use_external_data_format=False)
    elif quant is QuantScheme.FP16:
        onnx = require("onnx", "pip install onnx==1.23.2", purpose="the ONNX route")
        from onnxruntime.transformers.float16 import convert_float_to_float16

        model = convert_float_to_float16(onnx.load(str(float_path)), keep_io_types=True)
        _toposort(model.graph)  # the converter appends its input casts at the end; onnx.checker wants them first
        onnx.save(model, str(out))
    else:
        raise BadInput(f"quantization {quant.value!r} is not valid for ONNX (valid: int8, int4w, fp16)")


def _toposort(graph: Any) -> None:
    """Reorder ``graph.node`` so every node comes after the producers of its inputs (stable otherwise)."""
    produced_by = {out: i for i, node in enumerate(graph.node) for out in node.output}
    order: list[int] = []
    state = [0] * len(graph.node)  # 0 new, 1 visiting, 2 done

    def visit(i: int) -> None:
        stack = [(i, iter(graph.node[i].input))]
        state[i] = 1
        while stack:
            j, inputs = stack[-1]
            for name in inputs:
                k = produced_by.get(name)
                if k is not None and state[k] == 0:
                    state[k] = 1
                    stack.append((k, iter(graph.node[k].input)))
                    break
            else:
                stack.pop()
                state[j] = 2
                order.append(j)

    for i in range(len(graph.node)):
        if state[i] == 0:
            visit(i)
    nodes = [graph.node[i] for i in order]
    del graph.node[:]
    graph.node.extend(nodes)


def _gemm_to_matmul(graph: Any) -> None:
    """Rewrite Gemm(x, W, b) with constant W (alpha = beta = 1) as MatMul(x, W or W^T) + Add(b), in place."""
    from onnx import helper, numpy_helper

    inits = {i.name: i for i in graph.initializer}
    nodes = []
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if (node.op_type != "Gemm" or node.input[1] not in inits or attrs.get("transA", 0)
                or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0):
            nodes.append(node)
            continue
        weight = numpy_helper.to_array(inits[node.input[1]])
        if attrs.get("transB", 0):
            weight = weight.T.copy()
        name = node.input[1] + "_matmul"
        graph.initializer.append(numpy_helper.from_array(weight, name))
        product = node.output[0] + ("_matmul" if len(node.input) > 2 else "")
        nodes.append(helper.make_node("MatMul", [node.input[0], name], [product], name=node.name + "_matmul"))
        if len(node.input) > 2 and node.input[2]:
            nodes.append(helper.make_node("Add", [product, node.input[2]], [node.output[0]], name=node.name + "_bias"))
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in graph.node for name in node.input}
    kept = [i for i in graph.initializer if i.name in used]  # the Gemm weights replaced above
    del graph.initializer[:]
    graph.initializer.extend(kept)
