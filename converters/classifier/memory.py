"""How many activation bytes a converted model needs at batch 1, measured for the memory planner (``arena_bytes``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def arena_bytes(backend: Any, float_path: Path, ext: str) -> int:
    """Activation bytes at batch 1 for the planner.

    TFLite: every non-constant tensor (an upper bound: measured peak RSS came out 0.6-0.8x of the plan; the peak
    of tensors alive at once under-counted it, XNNPACK keeping packed weights and workspaces besides).
    ONNX: the peak of tensors alive at once (runtime.classify.plan.peak_live_bytes) over ORT's own basic-optimized
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

    from runtime.classify.plan import peak_live_bytes

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
